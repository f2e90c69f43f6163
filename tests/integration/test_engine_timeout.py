"""Timeouts and cancellation kill every process of a call, escapees included."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from bashfleet.worker import Policy
from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.watcher import Spawned

from .engine_helpers import (
    Engine,
    Stat,
    Watch,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    alive,
    marked_pids,
    stat,
    survivors,
    wait_until,
)

QUICK_KILL = Policy(on_timeout="kill", kill_grace_s=0.5)

# Children of every kind: plain background children, a `setsid` escape (new session),
# `nohup ... &`, and a double fork whose grandchild is orphaned (reparented away from
# the call). Each writes its pid to a file; `ready` says they all exist.
ESCAPES = r"""
sleep 301 &
echo $! > plain.pid
setsid sleep 302 &
echo $! > setsid.pid
nohup sleep 303 > /dev/null 2>&1 &
echo $! > nohup.pid
( (sleep 304 & echo $! > double.pid) & )
until [ -s double.pid ]; do sleep 0.01; done
echo started
touch ready
sleep 300
"""


def _read_pid(path: Path) -> int:
    return int(path.read_text().strip())


def test_timeout_kill_leaves_no_process_alive(plain_engine: Engine) -> None:
    # Unsandboxed: the pids the command prints are the host's, and only the group kill
    # and the marker sweep reach the escapees (test_engine_sandbox has the sandboxed case).
    engine = plain_engine
    work = engine.tmp
    seen: dict[str, Stat] = {}
    bash: list[int] = []

    def escapes_settled(pid: int) -> bool:
        if not (work / "ready").exists():
            return False
        found = {name: stat(_read_pid(work / f"{name}.pid"))
                 for name in ("plain", "setsid", "nohup", "double")}
        if any(s is None for s in found.values()):
            return False
        setsid_done = found["setsid"] is not None and found["setsid"].sid != pid
        orphaned = found["double"] is not None and not alive_marked_parent(found["double"])
        if setsid_done and orphaned:
            seen.update({k: v for k, v in found.items() if v is not None})
            return True
        return False

    def alive_marked_parent(child: Stat) -> bool:
        return child.ppid in marked_pids(marker)

    class SettledFirst(Watch):
        def spawned(self, process: Spawned) -> None:
            # The engine starts the timeout clock after this returns: wait here until
            # every escape has really escaped, so the kill meets all of them.
            bash.append(process.pid)
            wait_until(lambda: escapes_settled(process.pid), what="the escapes to settle")

    marker = engine.janitor.new_call_id()
    result = engine.run(ESCAPES, call_id=marker, timeout_s=1.0, policy=QUICK_KILL,
                        watcher=SettledFirst())

    pgid = bash[0]
    # The escapes were real: a new session, and a grandchild no longer under the call.
    assert seen["setsid"].sid == seen["setsid"].pid != pgid
    assert seen["plain"].pgid == seen["nohup"].pgid == pgid
    assert seen["double"].pgid == pgid
    # All of them are gone now, with nothing left in the group or carrying the marker.
    assert [name for name, s in seen.items() if alive(s.pid)] == []
    assert survivors(marker, pgid) == []
    assert not alive(pgid)

    assert result.timed_out
    assert not result.backgrounded
    assert result.exit_code is None
    assert result.signal == 15
    assert result.error is None  # no survivor
    # The notice says what the call was doing when its time ran out: every process of
    # it, escapees included, with state and CPU; and how long ago it last printed.
    doing = {p.pid for p in result.processes}
    assert {s.pid for s in seen.values()} <= doing
    assert all(p.state and p.cpu_s >= 0 and p.command for p in result.processes)
    assert result.last_output_age_s is not None and result.last_output_age_s >= 0
    assert result.stdout == "started\n"


def test_sigterm_ignored_is_sigkilled_after_grace(engine: Engine) -> None:
    # The trap prints when SIGTERM arrives (and the loop goes on): the kill must come.
    command = (
        "trap 'echo got-term' TERM; echo armed; "
        "while :; do sleep 0.05; done"
    )
    grace = 0.5
    policy = Policy(on_timeout="kill", kill_grace_s=grace)
    started = time.monotonic()
    result = engine.run(command, timeout_s=0.5, policy=policy)
    elapsed = time.monotonic() - started

    assert result.timed_out
    assert result.signal == 9
    assert result.exit_code is None
    assert result.error is None
    assert result.stdout.startswith("armed\n")
    assert "got-term" in result.stdout
    assert elapsed >= 0.5 + grace
    assert survivors(result.call_id) == []


def test_sigterm_ignored_by_every_process_is_sigkilled(engine: Engine) -> None:
    # SIG_IGN is inherited through exec: the sleep ignores SIGTERM too.
    result = engine.run(
        "trap '' TERM; sleep 300 & setsid sleep 300 & echo armed; sleep 300",
        timeout_s=0.5, policy=Policy(on_timeout="kill", kill_grace_s=0.3),
    )
    assert result.timed_out
    assert result.signal == 9
    assert result.stdout == "armed\n"
    assert survivors(result.call_id) == []


def test_cancel_from_another_thread_kills_the_call(engine: Engine) -> None:
    watch = Watch()

    def cancel_when_running() -> None:
        wait_until(lambda: watch.spawns, what="the spawn")
        # bash plus its two sleeps, one of them escaped with setsid.
        wait_until(lambda: len(marked_pids(marker)) >= 3, what="the call's processes")
        watch.cancel.set()

    marker = engine.janitor.new_call_id()
    canceller = threading.Thread(target=cancel_when_running)
    canceller.start()
    started = time.monotonic()
    result = engine.run(
        "sleep 300 & setsid sleep 300 & echo up; sleep 300",
        call_id=marker, timeout_s=60, watcher=watch,
    )
    canceller.join()

    assert time.monotonic() - started < 30
    assert not result.timed_out
    assert result.cancelled
    assert result.error is not None
    assert result.error.kind == "cancelled"
    assert "cancel" in result.error.message
    assert result.signal == 15
    assert result.stdout == "up\n"
    assert survivors(marker, watch.spawns[0].pid) == []


def test_daemon_does_not_hold_the_call(plain_engine: Engine) -> None:
    # Output goes to files, not pipes: a child that keeps them open does not delay the end.
    # Unsandboxed, the daemon outlives the call (in a sandbox it dies with it).
    engine = plain_engine
    started = time.monotonic()
    result = engine.run("sleep 300 & echo daemon=$!; exit 0", timeout_s=60)
    assert time.monotonic() - started < 10
    assert result.exit_code == 0
    assert not result.timed_out
    daemon = int(result.stdout.strip().removeprefix("daemon="))
    assert marked_pids(result.call_id) == [daemon]
    assert alive(daemon)
    # Clean it up here, by pid, and check it is gone (the janitor would too).
    engine.janitor.pid(daemon)
    engine.janitor.cleanup()
    assert not alive(daemon)


def test_stopped_children_are_killed(engine: Engine) -> None:
    # SIGTERM waits while a process is stopped; SIGKILL does not.
    result = engine.run(
        "sleep 300 & kill -STOP $!; setsid sleep 300 & kill -STOP $!; echo stopped; sleep 300",
        timeout_s=0.5, policy=Policy(on_timeout="kill", kill_grace_s=0.3),
    )
    assert result.timed_out
    assert result.stdout == "stopped\n"
    assert result.error is None
    assert survivors(result.call_id) == []


def test_a_failing_watcher_leaves_no_process(engine: Engine) -> None:
    # The fleet records the process when told of it; when that fails (Redis down), the
    # error reaches the caller and the call's processes must not be left running.
    spawned: list[int] = []

    class Failing(Watch):
        def spawned(self, process: Spawned) -> None:
            spawned.append(process.pid)
            wait_until(lambda: len(marked_pids(process.marker)) >= 2,
                       what="the call's processes")
            raise RuntimeError("could not record the call")

    marker = engine.janitor.new_call_id()
    with pytest.raises(RuntimeError, match="could not record"):
        engine.run("setsid sleep 300 & sleep 300", call_id=marker, watcher=Failing())
    assert spawned
    assert survivors(marker, spawned[0]) == []


def test_the_running_event_comes_once_while_the_call_runs(engine: Engine) -> None:
    calls: list[float] = []

    class Timed(Watch):
        def running(self) -> None:
            calls.append(time.monotonic())

    result = engine.run("sleep 0.5", watcher=Timed())
    ended = time.monotonic()
    assert result.exit_code == 0
    assert len(calls) == 1  # at the first wake-up that found it running, not again
    assert ended - calls[0] > 0.2  # well before the command ended


def test_a_daemon_left_in_a_session_workspace_lives_on_without_holding_the_call(
    engine: Engine,
) -> None:
    """A call ends when its bash ends: in a session workspace what it left running (a dev
    server, `sleep &`) lives on, never holds the call open, and the next call of the
    workspace sees it by the number the first one printed (its PID namespace's) and can
    end it. A timeout still kills the call's own group (the tests above)."""
    workspace = engine.workspace()
    started = time.monotonic()
    result = engine.run("sleep 300 & echo daemon=$!; exit 0", workspace=workspace.id,
                        timeout_s=60)
    assert time.monotonic() - started < 10
    assert (result.exit_code, result.timed_out, result.error) == (0, False, None)
    daemon = int(result.stdout.strip().removeprefix("daemon="))
    host_pids = workspaces.processes(workspace)
    assert len(host_pids) == 1
    # The daemon may still be in its exec of `sleep` as the call returns (bash does not
    # wait for it): its environment reads empty until the exec is done.
    wait_until(lambda: marked_pids(result.call_id) == host_pids,
               what="the daemon to carry the call's marker")

    seen = engine.run(f"kill -0 {daemon} && echo alive; tr '\\0' ' ' < /proc/{daemon}/cmdline",
                      workspace=workspace.id)
    assert seen.stdout == "alive\nsleep 300 "
    ended = engine.run(f"kill {daemon}; while kill -0 {daemon} 2>/dev/null; do sleep 0.01; done",
                       workspace=workspace.id)
    assert ended.exit_code == 0
    wait_until(lambda: not any(alive(pid) for pid in host_pids), what="the daemon's end")
    assert workspaces.processes(workspace) == []
