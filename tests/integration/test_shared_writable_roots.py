"""A shared cache the operator lists as writable, root's with mode 1777 as /tmp is.

Every workspace writes there as its own host ids, as local accounts do in /tmp: a file
a call makes is owned on the host by that workspace's ids (never root, never the run
user every workspace shares), and the sticky bit keeps one tenant from removing
another's. Before, the root was shown through a map of the run user alone: root's
directory was nobody's, and every write failed with Permission denied.
"""

from __future__ import annotations

import os
import pwd
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import sandbox
from bashfleet.worker.settings import Settings

from .conftest import WorkerFactory, WorkerProcess
from .engine_helpers import give_to_run_user

pytestmark = needs_root("ids per workspace need a root worker")


@pytest.fixture
def shared() -> Iterator[Path]:
    # Where every workspace can reach it: the test's tmp_path is under a 0700 directory
    # of root's, which an unmapped id cannot cross.
    path = Path("/var/tmp") / f"bf-shared-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    os.chown(path, 0, 0)
    path.chmod(0o1777)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def owned(shared: Path) -> Iterator[Path]:
    """A root the run user owns (mode 0755): shown through the run user's map, as
    before."""
    path = shared.with_name(shared.name + "-owned")
    path.mkdir(mode=0o755)
    give_to_run_user(path)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def worker(workers: WorkerFactory, shared: Path, owned: Path) -> WorkerProcess:
    return workers.start(f"shw-{uuid.uuid4().hex[:6]}",
                         env={"BASHFLEET_SANDBOX_WRITABLE": f"{shared},{owned}"})


@pytest.fixture
def fleet(redis_server: RedisServer) -> Iterator[Fleet]:
    with Fleet(redis_server.url, owner=f"sh-{uuid.uuid4().hex[:6]}") as client:
        yield client


def test_a_root_1777_writable_root_takes_each_workspaces_files_as_its_own(
    worker: WorkerProcess, fleet: Fleet, shared: Path
) -> None:
    if sandbox.host_ids(Settings(host="x", state_dir=worker.state_dir)) is None:
        pytest.skip("this host gives workspaces no ids of their own")
    with fleet.workspace(host=worker.host) as alice, fleet.workspace(host=worker.host) as bob:
        made = alice.run(f"echo cached > {shared}/a.txt && cat /proc/self/uid_map",
                         check=False)
        assert made.exit_code == 0, made.stderr
        alice_uid = int(made.stdout.split()[1])
        owner = (shared / "a.txt").stat()
        assert owner.st_uid == alice_uid and owner.st_uid != 0
        assert (shared / "a.txt").read_text() == "cached\n"
        # Another tenant reads it (mode 0644) but, as in /tmp, cannot remove or change it.
        peer = bob.run(f"cat {shared}/a.txt; rm -f {shared}/a.txt; "
                       f"echo x >> {shared}/a.txt; touch {shared}/b.txt && "
                       "cat /proc/self/uid_map", check=False)
        assert peer.stdout.startswith("cached\n"), peer.stdout + peer.stderr
        assert "Permission denied" in peer.stderr or "Operation not permitted" in peer.stderr
        assert (shared / "a.txt").read_text() == "cached\n"
        bob_uid = int(peer.stdout.splitlines()[1].split()[1])
        assert bob_uid != alice_uid
        assert (shared / "b.txt").stat().st_uid == bob_uid


def test_a_writable_root_of_the_run_users_still_makes_the_run_users_files(
    worker: WorkerProcess, fleet: Fleet, owned: Path
) -> None:
    with fleet.workspace(host=worker.host) as ws:
        made = ws.run(f"echo x > {owned}/c.txt && stat -c %u {owned}", check=False)
        assert made.exit_code == 0, made.stderr
    run_user = pwd.getpwnam(sandbox.run_user_name(Settings(host="x",
                                                           state_dir=worker.state_dir)))
    assert made.stdout == "0\n"  # the run user's directory is the workspace root's
    assert (owned / "c.txt").stat().st_uid == run_user.pw_uid
