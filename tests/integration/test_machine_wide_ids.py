"""Two real workers on one machine and the host ids of their workspaces.

Two workers that claim ids under lock directories of their own (two containers, each
with its own `/run`) hand two tenants the same host ids; sharing the lock directory (the
deploy files bind the host's into every worker) or giving each worker a range of its own
keeps every workspace's ids its own. A worker that cannot show its lock directory is the
machine's (a container's own) says so at start and in `bashfleet hosts`; so does one whose
workspaces get no cgroup. A container's healthcheck asks about its own host, not any.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.client import Fleet, records
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import id_slots

from .conftest import WorkerFactory, WorkerProcess, wait_for

pytestmark = needs_root("ids per workspace need a root worker")

SLOT = id_slots.SLOT_SIZE
#: Far from where other fleets of this machine usually claim (their first slot is random
#: over the whole range: the test's own lock directories keep it apart from them anyway).
BASE = 2147483648 - 64 * SLOT


def _subids_ok() -> bool:
    try:
        text = Path("/etc/subuid").read_text()
    except OSError:
        return False
    return any(r.start <= BASE and r.start + r.count >= BASE + 8 * SLOT
               for r in id_slots.subid_ranges(text, ("bashfleet-run",)))


needs_subids = pytest.mark.skipif(not _subids_ok(), reason="run scripts/bootstrap.sh as root")


def _env(lock_dir: Path, id_range: str) -> dict[str, str]:
    # One command slot and no blank keepers ahead: each worker holds one workspace ready
    # (its throwaway), the one its next call without a session runs in.
    return {"BASHFLEET_ID_LOCK_DIR": str(lock_dir), "BASHFLEET_WORKSPACE_POOL": "0",
            "BASHFLEET_ID_RANGE": id_range}


def _start_two(workers: WorkerFactory, env_a: dict[str, str],
               env_b: dict[str, str]) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:6]
    a = workers.start(f"ida-{suffix}", env=env_a, wait=False, concurrency=1)
    b = workers.start(f"idb-{suffix}", env=env_b, wait=False, concurrency=1)
    a.wait_ready(workers.client)
    b.wait_ready(workers.client)
    return a.host, b.host


def _host_uid(fleet: Fleet, host: str) -> int:
    """The host uid a call on `host` is root as (its workspace's first id)."""
    mapped = fleet.run("cat /proc/self/uid_map", host=host).stdout.split()
    assert mapped[0] == "0" and mapped[2] == str(SLOT), mapped
    return int(mapped[1])


@pytest.fixture
def fleet(redis_server: RedisServer) -> Iterator[Fleet]:
    with Fleet(redis_server.url, owner=f"ids-{uuid.uuid4().hex[:6]}") as client:
        yield client


@needs_subids
def test_lock_directories_of_their_own_give_two_tenants_the_same_ids(
    workers: WorkerFactory, fleet: Fleet, tmp_path: Path
) -> None:
    """The failure: each worker sees only its own claims (a container's private /run)."""
    one = f"{BASE}:{SLOT}"
    a, b = _start_two(workers, _env(tmp_path / "a", one), _env(tmp_path / "b", one))
    assert _host_uid(fleet, a) == _host_uid(fleet, b) == BASE


@needs_subids
def test_a_shared_lock_directory_never_gives_an_id_twice(
    workers: WorkerFactory, fleet: Fleet, tmp_path: Path
) -> None:
    two = f"{BASE}:{2 * SLOT}"
    shared = tmp_path / "shared"
    a, b = _start_two(workers, _env(shared, two), _env(shared, two))
    # Each worker's ready workspace holds a slot: both are taken, by one worker each.
    wait_for(lambda: id_slots.held(BASE, BASE, lock_dir=shared)
             and id_slots.held(BASE + SLOT, BASE + SLOT, lock_dir=shared), 60,
             "both workers' ready workspaces")
    assert {_host_uid(fleet, a), _host_uid(fleet, b)} == {BASE, BASE + SLOT}


@needs_subids
def test_ranges_of_their_own_keep_workers_apart_without_sharing_a_lock(
    workers: WorkerFactory, fleet: Fleet, tmp_path: Path
) -> None:
    a, b = _start_two(workers, _env(tmp_path / "a", f"{BASE}:{SLOT}"),
                      _env(tmp_path / "b", f"{BASE + SLOT}:{SLOT}"))
    assert _host_uid(fleet, a) == BASE
    assert _host_uid(fleet, b) == BASE + SLOT
    for host in (a, b):
        info = next(h for h in fleet.hosts() if h.host == host)
        assert info.sandbox is not None and info.sandbox.id_problem is None


def test_a_range_outside_the_run_users_ids_refuses_the_start(
    workers: WorkerFactory, tmp_path: Path
) -> None:
    worker = workers.start(f"idbad-{uuid.uuid4().hex[:6]}",
                           env=_env(tmp_path / "l", f"1000:{SLOT}"), wait=False)
    assert worker.proc is not None
    worker.proc.wait(60)
    assert worker.proc.returncode != 0
    assert "is not within the subordinate uids" in worker.log()


class ContainedWorker(WorkerProcess):
    """A worker as a container runs it: a PID namespace of its own (its /proc/1 is not
    the machine's init) and the machine's cgroup file systems mounted read-only."""

    def args(self) -> list[str]:
        setup = ("for m in $(awk '$3 == \"cgroup\" || $3 == \"cgroup2\" {print $2}' "
                 "/proc/self/mounts); do mount -o remount,bind,ro \"$m\"; done; "
                 'exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
                "--mount-proc", "sh", "-c", setup, "sh", *super().args()]


def _hosts_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BASHFLEET_HOST"}
    env["BASHFLEET_REDIS_URL"] = url
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli", "hosts", *args],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


@needs_subids
def test_a_container_worker_says_what_it_cannot_give(
    redis_server: RedisServer, workers: WorkerFactory, tmp_path: Path
) -> None:
    host = f"idbox-{uuid.uuid4().hex[:6]}"
    worker = ContainedWorker(host, redis_server.url, state_dir=workers.state_dir(host),
                             log_dir=tmp_path / "logs", projects=workers.projects,
                             extra_env={"BASHFLEET_ID_LOCK_DIR": str(tmp_path / "own-ids")})
    worker.start()
    workers.started.append(worker)

    def ready() -> bool:
        # Its pid in its own namespace is not the one this test knows.
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()
        info = records.host_info(workers.client, host, keys=worker.record_keys())
        return bool(info and info.ready)

    wait_for(ready, 60, f"worker {host} to be ready")
    log = worker.log()
    assert "host ids may not be this machine's alone" in log, log
    assert "workspaces get no cgroup of their own" in log, log
    info = records.host_info(workers.client, host, keys=worker.record_keys())
    assert info is not None and info.sandbox is not None
    assert info.sandbox.cgroup is None and info.sandbox.cgroup_problem
    assert info.sandbox.id_problem and "container" in info.sandbox.id_problem
    listed = _hosts_cli(redis_server.url)
    row = next(line for line in listed.stdout.splitlines() if line.startswith(host + " "))
    assert "ids per workspace (NOT machine-wide)" in row and "no cgroup" in row, listed.stdout
    assert f"{host}: this worker runs in a container" in listed.stderr

    # Its healthcheck: its own host's heartbeat, not whether Redis answers for any host.
    assert _hosts_cli(redis_server.url, "--alive", host).returncode == 0
    wrong = _hosts_cli(redis_server.url, "--alive", f"{host}-not-me")
    assert wrong.returncode == 1 and "no worker record" in wrong.stderr
    worker.stop()
    wait_for(lambda: _hosts_cli(redis_server.url, "--alive", host).returncode == 1, 60,
             "the stopped worker's healthcheck to fail")
