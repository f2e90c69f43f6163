"""The engine's one interface to whoever runs a call (`engine.watcher.CallWatcher`):
what a watcher hears of a real in-process call (unsandboxed, a private state
directory), in which order, and what its answers do."""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bashfleet.worker import Call, Settings, run_call
from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.watcher import UNWATCHED, CallWatcher, Spawned, Unwatched


class Recorder(Unwatched):
    """Everything the engine tells or asks, in order; cancels once `cancel_after`
    questions came after the call was running."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.log: list[str] = []
        self.spawns: list[Spawned] = []
        self.output_dir_there: list[bool] = []
        """At each spawn: whether its output directory was there (after the call, a
        throwaway workspace's may be gone with it)."""
        self.cancel_after = cancel_after

    def spawned(self, process: Spawned) -> None:
        self.log.append("spawned")
        self.spawns.append(process)
        self.output_dir_there.append(process.output_dir.is_dir())

    def running(self) -> None:
        self.log.append("running")

    def cancelled(self) -> bool:
        self.log.append("cancelled?")
        if self.cancel_after is None or "running" not in self.log:
            return False
        asked = len(self.log) - self.log.index("running") - 1
        return asked >= self.cancel_after

    def detach_requested(self) -> bool:
        self.log.append("detach?")
        return False

    def events(self) -> list[str]:
        """What it was told (the questions left out)."""
        return [entry for entry in self.log if not entry.endswith("?")]


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    (tmp_path / "work").mkdir()
    yield Settings(state_dir=tmp_path / "state", host="test", isolation="none",
                   workspace_root=tmp_path / "workspaces",
                   workspace_allow=(str(tmp_path / "work"),))
    # The throwaway pool's threads, then its workspaces: none outlives the test.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        t.name.startswith("bashfleet-throwaway") for t in threading.enumerate()
    ):
        time.sleep(0.01)
    workspaces.throwaways.close()


def _call(settings: Settings, command: str, call_id: str) -> Call:
    cwd = settings.workspace_allow[0]
    return Call(call_id=call_id, command=command, cwd=cwd, timeout_s=20)


def test_run_call_takes_one_watcher_and_nothing_else() -> None:
    # Every event and question goes through the watcher: no hook beside it.
    assert list(inspect.signature(run_call).parameters) == ["call", "settings", "watcher"]
    watcher: CallWatcher = Unwatched()
    assert not watcher.cancelled() and not watcher.detach_requested()
    assert isinstance(UNWATCHED, Unwatched)


def test_a_watcher_hears_spawn_then_running_of_a_real_call(settings: Settings) -> None:
    recorder = Recorder()
    result = run_call(_call(settings, "echo $$; sleep 0.3; echo done", "watch-1"),
                      settings=settings, watcher=recorder)
    assert result.exit_code == 0, result
    pid = int(result.stdout.splitlines()[0])

    assert recorder.events() == ["spawned", "running"]
    [spawned] = recorder.spawns
    assert (spawned.pid, spawned.pgid, spawned.marker) == (pid, pid, "watch-1")
    # Where the call's output was written while it ran (a reader follows it there).
    assert recorder.output_dir_there == [True]
    # Asked whether to cancel at every wake-up; whether to detach only once running.
    first_running = recorder.log.index("running")
    assert recorder.log[1] == "cancelled?"
    assert "detach?" not in recorder.log[:first_running]
    assert recorder.log.count("detach?") >= 2


def test_a_call_that_ends_at_once_is_never_running(settings: Settings) -> None:
    recorder = Recorder()
    result = run_call(_call(settings, "true", "watch-2"), settings=settings, watcher=recorder)
    assert result.exit_code == 0
    assert recorder.events() == ["spawned"]
    assert "detach?" not in recorder.log


def test_the_watchers_cancel_kills_the_call(settings: Settings) -> None:
    recorder = Recorder(cancel_after=2)
    started = time.monotonic()
    result = run_call(_call(settings, "echo up; sleep 30", "watch-3"), settings=settings,
                      watcher=recorder)
    assert time.monotonic() - started < 10
    assert result.cancelled
    assert result.error is not None and result.error.kind == "cancelled"
    assert result.stdout == "up\n"
    assert recorder.events() == ["spawned", "running"]


class Refusing(Recorder):
    """Says no when asked whether the call may start (the fleet's claim refused it)."""

    def starting(self) -> None:
        self.log.append("starting")
        raise LookupError("not this worker's call")


def test_starting_is_asked_once_before_the_spawn(settings: Settings) -> None:
    class Asked(Recorder):
        def starting(self) -> None:
            self.log.append("starting")

    recorder = Asked()
    assert run_call(_call(settings, "true", "watch-5"), settings=settings,
                    watcher=recorder).exit_code == 0
    assert recorder.events() == ["starting", "spawned"]


def test_a_start_refused_starts_nothing_and_gives_the_workspace_back(
    settings: Settings, tmp_path: Path
) -> None:
    marker = tmp_path / "work" / "ran"
    # The call may run as the host's run-as user: it writes in its cwd (this directory,
    # open to it), by a path that needs no search of the parents it may not enter.
    marker.parent.chmod(0o777)
    # What the check below looks for is what the command leaves when it runs.
    assert run_call(_call(settings, "touch ran", "watch-6"),
                    settings=settings).exit_code == 0
    assert marker.exists()
    marker.unlink()
    recorder = Refusing()
    with pytest.raises(LookupError):
        run_call(_call(settings, "touch ran", "watch-7"), settings=settings,
                 watcher=recorder)
    assert recorder.events() == ["starting"] and not marker.exists()
    # The throwaway workspace it was given went back: the next call runs as ever.
    assert run_call(_call(settings, "echo next", "watch-8"),
                    settings=settings).stdout == "next\n"


def test_no_watcher_is_the_quiet_one(settings: Settings) -> None:
    result = run_call(_call(settings, "echo plain", "watch-4"), settings=settings)
    assert result.exit_code == 0 and result.stdout == "plain\n"


class Keeping(Unwatched):
    """Keeps the step that puts the call's workspace away, as the fleet's watcher does
    until the call's answer went out."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], None]] = []

    def put_away(self, step: Callable[[], None]) -> None:
        self.steps.append(step)


def _ready_ids() -> set[str]:
    with workspaces.throwaways.lock:
        return {record.id for ready in workspaces.throwaways.ready.values() for record in ready}


def test_a_calls_workspace_is_put_away_when_its_watcher_says(settings: Settings) -> None:
    workspaces.throwaways.fill(settings)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (workspaces.throwaways.filling or not _ready_ids()):
        time.sleep(0.01)
    before = _ready_ids()
    assert before, "the pool made its throwaways ahead"
    keeping = Keeping()
    # No cwd: the call takes one of the pool's (a cwd of its own makes one there).
    result = run_call(Call(call_id="watch-5", command="true", timeout_s=20),
                      settings=settings, watcher=keeping)
    assert result.exit_code == 0
    # The call took a ready throwaway; the step that gives it back is the watcher's.
    assert len(keeping.steps) == 1
    taken = before - _ready_ids()
    assert len(taken) == 1
    for step in keeping.steps:
        step()
    assert taken <= _ready_ids()


def test_a_calls_unkept_output_files_are_gone_by_its_answer(settings: Settings) -> None:
    """Output nobody reads again is removed before the answer goes out (it says none was
    kept: whoever looks at the host then finds none), not left to the put-away step."""
    keeping = Keeping()
    result = run_call(Call(call_id="watch-9", command="echo out; echo err >&2", timeout_s=20),
                      settings=settings, watcher=keeping)
    assert (result.stdout, result.stderr, result.spill) == ("out\n", "err\n", None)
    root = settings.workspace_root
    assert root is not None
    assert _named(root, "watch-9.") == []
    # Kept output (cut, past the size a policy keeps) is there, and stays.
    kept = run_call(Call(call_id="watch-10", command="seq 1 20000", timeout_s=20),
                    settings=settings, watcher=keeping)
    assert kept.spill is not None and _named(root, "watch-10.") == ["watch-10.err",
                                                                    "watch-10.out"]
    for step in keeping.steps:
        step()
    assert _named(root, "watch-10.") == ["watch-10.err", "watch-10.out"]


def _named(root: Path, prefix: str) -> list[str]:
    """The files under `root` whose names start with `prefix`. A walk, not rglob: the
    throwaways' recycler removes other workspaces' folders meanwhile (os.walk skips a
    folder gone under it; rglob raises)."""
    return sorted(name for _, _, names in os.walk(root) for name in names
                  if name.startswith(prefix))


def test_an_unwatched_call_puts_its_workspace_away_before_it_returns(
        settings: Settings) -> None:
    workspaces.throwaways.fill(settings)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (workspaces.throwaways.filling or not _ready_ids()):
        time.sleep(0.01)
    before = _ready_ids()
    assert run_call(Call(call_id="watch-6", command="true", timeout_s=20),
                    settings=settings).exit_code == 0
    assert _ready_ids() == before


def test_a_call_that_started_a_job_puts_its_workspace_away_at_once(settings: Settings) -> None:
    """A job must outlive its worker from the moment its id is answered: its throwaway
    keeper is told so before run_call returns, never left to a step kept for later."""
    keeping = Keeping()
    result = run_call(Call(call_id="watch-7", command="sleep 0.2", timeout_s=20,
                           background=True), settings=settings, watcher=keeping)
    assert result.job is not None, result
    assert keeping.steps == []
    # Still the step's job for a call that started none (the effect could have happened).
    run_call(Call(call_id="watch-8", command="true", timeout_s=20), settings=settings,
             watcher=keeping)
    assert len(keeping.steps) == 1
    for step in keeping.steps:
        step()
