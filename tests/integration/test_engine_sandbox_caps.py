"""The workspace sandbox's caps and lifetimes: output, memory, process and CPU caps,
the user calls run as, a worker that is not root, what still works inside, and what
outlives a worker. The attacks on what a command may see, keep, write or reach:
test_engine_sandbox.py."""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root
from pydantic import ValidationError

from bashfleet.worker.engine import sandbox, teardown, workspaces
from bashfleet.worker.engine.isolate import launcher
from bashfleet.worker.engine.jobs.jobs import load_record
from bashfleet.worker.settings import Settings

from .engine_helpers import (
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    alive,
    engine_with,
    fd_holders,
    readable_install,
    wait_until,
)
from .sandbox_helpers import (
    AUTO,
    Workspaces,
    _job_end,
    _spaces_fixture,  # noqa: F401 - fixture
    needs_bubblewrap,
    needs_cgroups,
)

pytestmark = needs_bubblewrap

# -------------------------------------------------------------- caps and users


def test_output_cap_stops_a_flooding_call(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_output_mb=2) as engine:
        result = engine.run("yes flood")
        assert result.limit_hit == "output" and result.signal == 15
        assert "cap of 2 MiB; the call was stopped" in result.stderr
        assert "flood\nflood\n" in result.stdout


def _ended(engine: Engine, job_id: str) -> tuple[str, str | None, int | None]:
    """(the end of the job's output, its note, its signal) once it ended."""
    check = _job_end(engine, job_id)
    full = Path(load_record(job_id, engine.settings).output_path).read_text()
    return full[-300:], check.note, check.signal


@pytest.mark.parametrize("how", ["background", "auto-background"])
def test_output_cap_stops_a_flooding_job_with_a_notice(
    tmp_path: Path, janitor: Janitor, how: str
) -> None:
    with engine_with(tmp_path, janitor, limit_output_mb=2) as engine:
        if how == "background":
            result = engine.run("yes flood", background=True)
        else:
            result = engine.run("sleep 0.3; yes flood", timeout_s=0.1, policy=AUTO)
        assert result.job is not None
        tail, note, sig = _ended(engine, result.job.id)
        notice = "[bashfleet: the output passed this host's cap of 2 MiB; the job was stopped]"
        assert notice in tail
        assert tail.endswith("[background process failed: signal: 15 (SIGTERM)]\n")
        assert note is not None and "cap of 2 MiB" in note and sig == 15
        # Stopped near the cap (the runner watches it): 2 MiB, plus what `yes` writes in
        # the runner's last pause and the grace.
        assert os.stat(load_record(result.job.id, engine.settings).output_path).st_size < 200e6


@needs_cgroups
def test_cgroup_caps_memory(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_memory_mb=64) as engine:
        result = engine.run("grep -c bashfleet /proc/self/cgroup; "
                            "python3 -c 'x = bytearray(256 * 1024 * 1024)'")
        assert result.limit_hit == "memory", result
        assert result.signal == signal.SIGKILL or result.exit_code == 137
        assert int(result.stdout.split()[0]) >= 1  # it ran in a bashfleet cgroup
        fine = engine.run("python3 -c 'x = bytearray(8 * 1024 * 1024)'; echo ok")
        assert (fine.stdout, fine.limit_hit) == ("ok\n", None)


@needs_cgroups
@pytest.mark.parametrize("isolation", ["process", "none"])
def test_cgroup_caps_processes(tmp_path: Path, janitor: Janitor, isolation: str) -> None:
    with engine_with(tmp_path, janitor, limit_procs=16, isolation=isolation) as engine:
        result = engine.run("for i in $(seq 40); do sleep 2 & done; wait", timeout_s=60)
        assert result.limit_hit == "processes", result
        assert "fork" in result.stderr


BUSY_SECOND = (
    "python3 -c 'import os, time\nstart = time.time()\nwhile time.time() - start < 1: pass\n"
    "print(round(os.times().user + os.times().system, 2))'"
)


@needs_cgroups
def test_cgroup_caps_cpu_bandwidth(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_cpus=0.2) as engine:
        capped = float(engine.run(BUSY_SECOND).stdout)
    with engine_with(tmp_path / "free", janitor) as engine:
        free = float(engine.run(BUSY_SECOND).stdout)
    # A second of busy loop gets at most a fifth of a CPU second under the cap (about as
    # much as it gets when the machine is busy, so the uncapped one only has to do better).
    assert capped <= 0.3 and free > capped, (capped, free)


@pytest.fixture(name="shared_dir")
def _shared_dir_fixture() -> Iterator[Path]:
    """A directory another user can enter and write (pytest's tmp_path is 0700 root)."""
    folder = Path(tempfile.mkdtemp(prefix="bashfleet-runas-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        # Its hosts' workspaces first (their cgroups are outside it, named by their records).
        teardown.end_hosts_under(folder, workspace_root=lambda _: folder / "workspaces")
        shutil.rmtree(folder, ignore_errors=True)


@needs_root("needs a worker started as root")
@pytest.mark.parametrize("isolation", ["process", "none"])
def test_run_as_runs_calls_as_that_user(
    shared_dir: Path, janitor: Janitor, isolation: str
) -> None:
    nobody = pwd.getpwnam("nobody")
    work = shared_dir / "work"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    settings = Settings(state_dir=shared_dir / "state", host="t", run_as="nobody",
                        isolation=isolation, workspace_root=shared_dir / "workspaces",
                        workspace_allow=(str(work),))
    engine = Engine(settings, janitor, work)
    try:
        result = engine.run("id -u; id -g; echo $USER; touch mine; cd /; export LEFT=1",
                            capture_state=True)
        assert result.stdout.splitlines() == [str(nobody.pw_uid), str(nobody.pw_gid), "nobody"]
        assert (work / "mine").stat().st_uid == nobody.pw_uid
        assert (result.cwd_after, result.env_changes.get("LEFT")) == ("/", "1")
        job = engine.run("id -u > job-uid", background=True)
        assert job.job is not None
        _ended(engine, job.job.id)
        assert (work / "job-uid").read_text() == f"{nobody.pw_uid}\n"
    finally:
        sandbox.close_all()


def test_run_as_an_unknown_user_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="no such user"):
        Settings(run_as="no-such-user-bashfleet")


# ----------------------------------------------------------- a worker that is not root

ROOTLESS_SCRIPT = """
import json, os, sys
state, command = sys.argv[1], sys.argv[2]
os.environ["XDG_STATE_HOME"] = os.path.join(state, "xdg")
os.environ["XDG_DATA_HOME"] = os.path.join(state, "data")
from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox
from bashfleet.worker.settings import Settings
settings = Settings(state_dir=os.path.join(state, "state"), host="rootless")
result = run_call(Call(call_id="rootless-1", command=command), settings=settings)
print(json.dumps({"out": result.stdout, "err": result.stderr,
                  "error": result.error.message if result.error else None}))
import time
from bashfleet.worker.engine import workspaces
deadline = time.monotonic() + 10  # the throwaway's end runs in a thread: wait for it
while workspaces.local_records(settings) and time.monotonic() < deadline:
    time.sleep(0.05)
for record in workspaces.local_records(settings):
    workspaces.delete(record.id, settings)
sandbox.close_all()
"""


@needs_root("needs a worker started as root")
def test_a_worker_that_is_not_root_gets_the_same_sandbox() -> None:
    # A worker started by an ordinary user: bwrap makes a user namespace, the zygote and
    # keepers get its capabilities, the calls none. Run as `nobody` with the system Python
    # (the same 3.11 as this suite: the venv's packages import), its own state directory,
    # and the packages from a tree `nobody` can read (readable_install).
    state = Path(tempfile.mkdtemp(prefix="bashfleet-rootless-"))
    secret = state / "state" / "planted.key"
    try:
        nobody = pwd.getpwnam("nobody")
        os.chown(state, nobody.pw_uid, nobody.pw_gid)
        command = (f"id -u; grep CapEff /proc/self/status; ps -e | wc -l; cat {secret}; "
                   f"umount {state}/state; unshare -rm sh -c 'umount {state}/state; cat {secret}'; "
                   "touch /usr/planted; python3 -c 'import socket; "
                   "socket.socket(socket.AF_PACKET, socket.SOCK_RAW)' 2>&1 | tail -1; "
                   "echo done")
        script = f"import sys; sys.path[:0] = {list(readable_install())!r}\n" + ROOTLESS_SCRIPT
        done = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             "/usr/bin/python3", "-I", "-c", script, str(state), command],
            capture_output=True, text=True, timeout=120, check=False, cwd="/",
            env={"PATH": os.defpath, "HOME": str(state)},
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout.splitlines()[-1])
        assert answer["error"] is None, answer
        lines = answer["out"].splitlines()
        assert lines[0] == str(nobody.pw_uid)
        assert lines[1].split() == ["CapEff:", "0000000000000000"]
        assert int(lines[2]) <= 6  # ps's header, the holder (pid 1), the keeper, bash, ps, wc
        assert lines[-1] == "done"
        assert "PermissionError" in lines[-2]  # no raw socket in a call
        assert "planted" not in answer["out"]
        assert not Path("/usr/planted").exists()
    finally:
        shutil.rmtree(state, ignore_errors=True)


# ---------------------------------------------------------- what still works inside


def test_session_state_is_captured_inside(engine: Engine) -> None:
    result = engine.run("cd /; export FROM_SANDBOX=yes; unset HOME", capture_state=True)
    assert result.cwd_after == "/"
    assert result.env_changes == {"FROM_SANDBOX": "yes"}
    assert "HOME" in result.env_removed


def test_a_background_job_runs_in_its_workspace(engine: Engine, spaces: Workspaces) -> None:
    record = spaces.new()
    spaces.run(record, "sleep 300 &")
    result = spaces.run(record, "ps -eo args= | grep -c '^sleep 300'; echo $$", background=True)
    assert result.job is not None
    _job_end(engine, result.job.id)
    text = Path(load_record(result.job.id, engine.settings).output_path).read_text()
    count, pid = text.split("\n\n\n")[0].split()
    assert int(count) == 1 and int(pid) == result.job.pid


def test_a_workspace_past_its_disk_cap_is_told_so_and_its_jobs_stopped(
    engine: Engine, spaces: Workspaces
) -> None:
    record = spaces.new(limits={"disk_mb": 1})
    job = spaces.run(record, "sleep 300", background=True)
    assert job.job is not None
    spaces.run(record, "head -c 3000000 /dev/zero > big; head -c 10 /dev/zero > /tmp/small")
    used = workspaces.check_disk(record, engine.settings)
    assert used is not None and used > 2**20
    ended = _job_end(engine, job.job.id)
    assert ended.note is not None and "disk cap of 1 MiB" in ended.note
    told = spaces.run(record, "echo still here")
    assert told.stdout == "still here\n" and "past its cap of 1 MiB" in told.stderr
    refused = spaces.run(record, "sleep 1", background=True)
    assert refused.error is not None and refused.error.kind == "limit"
    spaces.run(record, "rm big")
    assert workspaces.check_disk(record, engine.settings) is None
    assert spaces.run(record, "echo fine").stderr == ""


# ----------------------------------------------------- what outlives a worker, and not

MAKER_SCRIPT = """
import json, sys, time
from bashfleet.worker.settings import Settings
from bashfleet.worker.engine import workspaces
from bashfleet.worker.wire.models import WorkspaceSpec
state = sys.argv[1]
settings = Settings(state_dir=state, host="maker", workspace_root=state + "-ws")
blank = workspaces.make_blank(settings, True)
record = workspaces.create(WorkspaceSpec(owner="o"), settings)
print(json.dumps({"blank": blank.pid, "workspace": record.keeper_pid}), flush=True)
time.sleep(120)
"""


def test_blank_keepers_end_with_their_maker_and_workspaces_outlive_it(tmp_path: Path) -> None:
    """A blank keeper made ahead by a worker process that dies would be claimed by none
    (they once piled up, hundreds, after killed workers and benchmarks): it ends with its
    maker. A workspace's keeper lives on, for the worker that restarts."""
    state = tmp_path / "state"
    maker = subprocess.Popen([sys.executable, "-c", MAKER_SCRIPT, str(state)],
                             stdout=subprocess.PIPE, text=True)
    try:
        made = json.loads(maker.stdout.readline() if maker.stdout else "{}")
    finally:
        maker.kill()
        maker.wait()
    settings = Settings(state_dir=state, host="maker", workspace_root=Path(f"{state}-ws"))
    try:
        wait_until(lambda: not alive(made["blank"]) or None, what="the blank keeper to end")
        assert alive(made["workspace"])
    finally:
        for record in workspaces.local_records(settings):
            workspaces.delete(record.id, settings)
    assert not alive(made["workspace"])


def test_no_blank_keeper_is_made_for_a_maker_already_gone(tmp_path: Path) -> None:
    """A blank asked for as its worker process stopped (a pool's fill thread racing the
    exit) would watch no one and live for ever (one was found after a CI run): the zygote
    refuses it, and no process holds the keeper's listening socket."""
    settings = Settings(state_dir=tmp_path / "state", host="gone",
                        workspace_root=tmp_path / "ws")
    gone = subprocess.Popen(["true"])
    gone.wait()
    listener = launcher.listen(str(tmp_path / "blank.sock"))
    try:
        with pytest.raises(OSError) as refused:
            sandbox.zygote.keeper(settings, {"network": True, "worker_uid": os.geteuid(),
                                             "maker": gone.pid}, [listener.fileno()])
        assert refused.value.errno == errno.ESRCH
        assert fd_holders(f"socket:[{os.fstat(listener.fileno()).st_ino}]") == {os.getpid()}
    finally:
        listener.close()
