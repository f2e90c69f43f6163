"""A workspace whose keeper sleeps: idle past `keeper_idle_s`, its Python keeper exits
and its holder (a static C program, pid 1) keeps the namespaces, the processes left
running and the lease; the next call, job or worker wakes a keeper and runs once."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine import files, holder, sandbox, workspaces
from bashfleet.worker.engine.isolate import launcher, proto
from bashfleet.worker.engine.workspaces import keeper_calls
from bashfleet.worker.wire.models import WorkspaceRecord

from .engine_helpers import (
    SPAWNER_FILTER,
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    alive,
    engine_with,
    holds_open,
    home_for_nobody,
    ns_pids,
    readable_install,
    wait_until,
)
from .sandbox_helpers import needs_bubblewrap

IDLE_S = 0.3

pytestmark = [needs_bubblewrap, needs_root(
    "a holder is exec'd by a keeper with host ids (a root worker)")]


@pytest.fixture(name="sleepy")
def _sleepy_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    with engine_with(tmp_path, janitor, keeper_idle_s=IDLE_S) as engine:
        path, problem = holder.find(engine.settings)
        assert path is not None, problem
        yield engine


def _exe(pid: int) -> str:
    return os.path.basename(os.readlink(f"/proc/{pid}/exe"))


def _asleep(record: WorkspaceRecord, also: int = 0) -> bool:
    """pid 1 is the holder and no Python keeper runs in the workspace (`also`: how many
    other processes, left by calls, are expected)."""
    pids = ns_pids(record)
    return len(pids) == 1 + also and _exe(int(record.keeper_pid or 0)).startswith("holder-") \
        and not any(_exe(pid).startswith("python") for pid in pids)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[0].decode()


def test_an_idle_workspace_sleeps_and_a_call_wakes_it_and_runs_once(sleepy: Engine) -> None:
    record = sleepy.workspace()
    first = sleepy.run("echo one >> /tmp/marker; cat /proc/1/comm", workspace=record.id,
                       cwd=None)
    assert first.exit_code == 0, first
    assert first.stdout.startswith("holder-")  # pid 1 is the holder from the start
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    woken = sleepy.run("echo two >> /tmp/marker; wc -l < /tmp/marker", workspace=record.id,
                       cwd=None)
    assert woken.exit_code == 0, woken
    # Two calls, two lines: the wake ran the second call once (twice would be three).
    assert woken.stdout.strip() == "2"
    assert wait_until(lambda: _asleep(record), what="it to sleep again", timeout=10)


def test_a_woken_keeper_starts_its_calls_by_the_spawner(sleepy: Engine) -> None:
    """The holder keeps the spawner for the services it wakes: their calls start as the
    first keeper's did (`tests/integration/test_spawner.py`), not by a fork."""
    spawner = holder.spawner(sleepy.settings)
    assert spawner is not None
    record = sleepy.workspace()
    sleepy.run("true", workspace=record.id, cwd=None)
    assert holds_open(record, SPAWNER_FILTER)
    for _ in range(2):
        assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
        assert not holds_open(record, SPAWNER_FILTER)
        # pid 1, the holder, keeps the spawner binary for the services it wakes.
        assert holds_open(record, os.path.realpath(spawner))
        woken = sleepy.run("echo $((6 * 7)); no-such-tool-here", workspace=record.id,
                           cwd=None)
        assert woken.stdout == "42\n" and "no-such-tool-here" in woken.stderr, woken
        assert holds_open(record, SPAWNER_FILTER)


def test_a_call_sent_to_the_holder_never_runs_and_a_worker_that_left_leaves_it_listening(
        sleepy: Engine) -> None:
    record = sleepy.workspace()
    sleepy.run("echo one >> /tmp/marker", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    assert record.socket_path is not None
    conn = launcher.KeeperConnection.connect(record.socket_path)
    request: proto.SpawnRequest = {"argv": ["/bin/sh", "-c", "echo two >> /tmp/marker"],
                                   "cwd": "/", "env": {"PATH": "/usr/bin:/bin"},
                                   "targets": []}
    with pytest.raises(launcher.KeeperAsleepError) as asleep:
        conn.start(request, [])  # the call first, as on a pooled connection
    # A worker that got the `Z` and went away without waking it.
    proto.close_all(asleep.value.fds)
    conn.close()
    after = sleepy.run("wc -l < /tmp/marker", workspace=record.id, cwd=None)
    # One line: the holder never ran the call sent to it (it would have made two).
    assert after.stdout.strip() == "1", after
    # Positive control: the same request, sent to a keeper, appends its line.
    awake = keeper_calls.awake(record, sleepy.settings)
    try:
        awake.start(request, [])
        assert awake.wait_status(10) == 0
    finally:
        awake.close()
    assert sleepy.run("wc -l < /tmp/marker", workspace=record.id, cwd=None).stdout == "2\n"


def test_calls_at_once_wake_a_sleeping_workspace_each_once(sleepy: Engine) -> None:
    record = sleepy.workspace()
    sleepy.run("touch /tmp/marker", workspace=record.id, cwd=None)
    for round_ in range(3):
        assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(
                lambda n: sleepy.run(f"echo {n} >> /tmp/marker", workspace=record.id,
                                     cwd=None), range(8)))
        assert [result.exit_code for result in results] == [0] * 8, results
        lines = sleepy.run("wc -l < /tmp/marker", workspace=record.id, cwd=None)
        assert lines.stdout.strip() == str(8 * (round_ + 1))  # each call once


NAMESPACES = "for ns in mnt pid ipc net user; do readlink /proc/self/ns/$ns; done"


def test_a_woken_keepers_calls_are_in_the_same_namespaces(sleepy: Engine) -> None:
    record = sleepy.workspace()
    before = sleepy.run(NAMESPACES, workspace=record.id, cwd=None).stdout.split()
    assert len(before) == 5, before
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    after = sleepy.run(NAMESPACES, workspace=record.id, cwd=None).stdout.split()
    assert after == before
    # Positive control: another workspace's calls are in namespaces of their own.
    other = sleepy.workspace()
    elsewhere = sleepy.run(NAMESPACES, workspace=other.id, cwd=None).stdout.split()
    assert len(elsewhere) == 5
    assert [elsewhere[i] != before[i] for i in range(4)] == [True] * 4  # mnt pid ipc net


def test_processes_left_running_outlive_its_sleep_and_are_reaped(sleepy: Engine) -> None:
    record = sleepy.workspace()
    result = sleepy.run("sleep 300 & sleep 1.5 & echo started", workspace=record.id,
                        cwd=None)
    assert result.stdout.strip() == "started"
    assert wait_until(lambda: _asleep(record, also=2), what="it to sleep, two sleeps running",
                      timeout=10)
    # The short sleep ends while only the holder is there: it reaps it (no zombie).
    assert wait_until(lambda: _asleep(record, also=1), what="the short sleep to be reaped",
                      timeout=10)
    left = [pid for pid in ns_pids(record) if pid != record.keeper_pid]
    assert [_state(pid) for pid in left] == ["S"]
    seen = sleepy.run("pgrep -x sleep | wc -l", workspace=record.id, cwd=None)
    assert seen.stdout.strip() == "1"  # the woken keeper's calls see what was left


def test_a_call_cannot_read_the_holders_or_keepers_descriptors(sleepy: Engine) -> None:
    record = sleepy.workspace()
    result = sleepy.run(
        "for p in $(ls /proc | grep -E '^[0-9]+$'); do "
        "  if ls /proc/$p/fd >/dev/null 2>&1; then echo open $p $(cat /proc/$p/comm); fi; "
        "done; ls /proc/1/fd; echo status $?", workspace=record.id, cwd=None)
    # Positive control: the call reads its own descriptors (its shell's), so a readable
    # /proc/PID/fd is reported; pid 1 (the holder) and the keeper are never among them.
    assert "open " in result.stdout
    assert "open 1 " not in result.stdout
    assert "python" not in result.stdout
    assert "status 2" in result.stdout


PTRACE = ("import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
          "print(*[(pid, libc.ptrace(16, int(pid), 0, 0), ctypes.get_errno()) "
          "for pid in sys.argv[1:]])")


def test_a_call_cannot_ptrace_the_holder_or_the_keeper(sleepy: Engine) -> None:
    record = sleepy.workspace()
    result = sleepy.run(
        "sleep 30 & mine=$!; keeper=$(pgrep -x 'python3?' | head -1); "
        f"python3 -c '{PTRACE}' $mine 1 $keeper; kill $mine", workspace=record.id, cwd=None)
    attempts = result.stdout.split(") (")
    assert len(attempts) == 3, result
    # Positive control: its own `sleep` is attached (0): ptrace itself is allowed.
    assert attempts[0].endswith(", 0, 0"), attempts
    assert attempts[1].startswith("'1', -1, 1"), attempts  # EPERM: pid 1, the holder
    assert ", -1, 1" in attempts[2], attempts  # EPERM: the keeper


def test_a_background_job_starts_in_a_sleeping_workspace(sleepy: Engine) -> None:
    record = sleepy.workspace()
    sleepy.run("true", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    started = sleepy.run("echo from-a-job", workspace=record.id, cwd=None, background=True)
    assert started.job is not None, started
    output = Path(started.job.output_path)
    assert wait_until(lambda: "from-a-job" in output.read_text(), what="the job's output",
                      timeout=10)


def test_an_interactive_job_starts_in_a_sleeping_workspace(sleepy: Engine) -> None:
    """Its supervisor has no zygote: the worker wakes the keeper and hands it a
    connection that keeps it awake."""
    record = sleepy.workspace()
    sleepy.run("true", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    started = sleepy.run("echo interactive; sleep 0.5", workspace=record.id, cwd=None,
                         background=True, stdin="pipe")
    assert started.job is not None, started
    output = Path(started.job.output_path)
    assert wait_until(lambda: "interactive" in output.read_text(), what="its output",
                      timeout=10)


def test_files_are_read_and_written_in_a_sleeping_workspace(sleepy: Engine) -> None:
    record = sleepy.workspace()
    sleepy.run("echo kept > /tmp/kept", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    data, _ = files.read_file(record, sleepy.settings, "/tmp/kept", offset=0, limit=1 << 10)
    assert data == b"kept\n"
    assert wait_until(lambda: _asleep(record), what="it to sleep again", timeout=10)
    files.write_file(record, sleepy.settings, "/tmp/written", b"new\n", mode=0o644)
    seen = sleepy.run("cat /tmp/written", workspace=record.id, cwd=None)
    assert seen.stdout == "new\n"


def test_a_new_worker_process_wakes_a_sleeping_workspace(sleepy: Engine) -> None:
    record = sleepy.workspace()
    sleepy.run("echo before > /tmp/mark", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record), what="the workspace to sleep", timeout=10)
    # What a restart leaves: no zygote and no pooled connection in this process.
    keeper_calls.connections.drop(record.id)
    sandbox.close_all()
    after = sleepy.run("cat /tmp/mark", workspace=record.id, cwd=None)
    assert after.stdout.strip() == "before", after


def test_the_lease_ends_a_sleeping_workspace(sleepy: Engine,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspaces.store, "LEASE_LOOK_S", 0.2)
    record = sleepy.workspace()
    sleepy.run("sleep 300 &", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record, also=1), what="the workspace to sleep",
                      timeout=10)
    pids = ns_pids(record)
    saved = workspaces.record_path(sleepy.settings, record.id).read_bytes()
    workspaces.record_path(sleepy.settings, record.id).unlink()  # as a dead worker's reaper
    try:
        assert wait_until(lambda: not any(alive(pid) for pid in pids),
                          what="the holder to end the workspace", timeout=10)
    finally:
        workspaces.record_path(sleepy.settings, record.id).write_bytes(saved)
        workspaces.delete(record.id, sleepy.settings)


def test_delete_ends_a_sleeping_workspace(sleepy: Engine) -> None:
    record = sleepy.workspace()
    sleepy.run("sleep 300 &", workspace=record.id, cwd=None)
    assert wait_until(lambda: _asleep(record, also=1), what="the workspace to sleep",
                      timeout=10)
    pids = ns_pids(record)
    assert len(pids) == 2
    workspaces.delete(record.id, sleepy.settings)
    assert wait_until(lambda: not any(alive(pid) for pid in pids),
                      what="every process of the workspace to end", timeout=10)


def test_throwaway_calls_keep_their_python_keepers(sleepy: Engine) -> None:
    """A throwaway workspace is bound to its maker and recycled by pid 1: no holder."""
    result = sleepy.run("cat /proc/1/comm")
    assert result.exit_code == 0
    assert "holder" not in result.stdout
    assert result.stdout.strip()  # positive control: pid 1's name was read


def test_keepers_never_sleep_with_keeper_idle_s_0(tmp_path: Path, janitor: Janitor) -> None:
    """keeper_idle_s 0: pid 1 is the Python keeper, which stays."""
    with engine_with(tmp_path, janitor, keeper_idle_s=0) as engine:
        record = engine.workspace()
        result = engine.run("cat /proc/1/comm", workspace=record.id, cwd=None)
        assert "holder" not in result.stdout and result.stdout.strip(), result
        time.sleep(IDLE_S * 3)  # what would be past its idle time, were there one
        assert not _asleep(record)



ROOTLESS = r"""
import json, os, sys, time
home = sys.argv[1]
os.environ["XDG_STATE_HOME"] = os.path.join(home, "xdg")
os.environ["XDG_DATA_HOME"] = os.path.join(home, "data")
from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
settings = Settings(state_dir=os.path.join(home, "state"), host="rootless-sleep",
                    keeper_idle_s=0.3, workspace_pool=0)
ws = workspaces.create(WorkspaceSpec(network="none"), settings)
n = [0]
def run(command):
    n[0] += 1
    result = run_call(Call(call_id=f"rootless-sleep-{n[0]}", command=command,
                           workspace=ws.id), settings=settings)
    return result.stdout.strip()
def comms():
    ns = os.readlink(f"/proc/{ws.keeper_pid}/ns/pid")
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/ns/pid") == ns:
                found.append(open(f"/proc/{pid}/comm").read().strip())
        except OSError:
            pass
    return found
out = {"first": run("echo one >> /tmp/marker; cat /proc/1/comm")}
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    out["asleep"] = comms()
    if len(out["asleep"]) == 1:
        break
    time.sleep(0.05)
out["second"] = run("echo two >> /tmp/marker; wc -l < /tmp/marker")
workspaces.delete(ws.id, settings)
sandbox.close_all()
print(json.dumps(out))
"""


@pytest.fixture(name="nobody_home")
def _nobody_home_fixture() -> Iterator[Path]:
    """A home `nobody` reaches (pytest's tmp_path is under root's 0700 folder)."""
    with home_for_nobody("bashfleet-rootless-sleep-") as home:
        yield home


def test_a_worker_that_is_not_root_sleeps_and_wakes_its_workspaces(nobody_home: Path) -> None:
    home = nobody_home
    nobody = pwd.getpwnam("nobody")
    done = subprocess.run(
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
         "/usr/bin/python3", "-c", ROOTLESS, str(home)],
        capture_output=True, text=True, timeout=240, check=False, cwd="/",
        env={"PATH": os.defpath, "HOME": str(home),
             "PYTHONPATH": os.pathsep.join(readable_install())})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["first"].startswith("holder-")
    assert len(out["asleep"]) == 1 and out["asleep"][0].startswith("holder-"), out
    assert out["second"] == "2", out  # woken, and the second call ran once
