"""Fixtures and helpers for the engine's integration tests: real processes, always cleaned up.

Test modules import the fixtures they use from here (pytest finds fixtures among a
module's attributes, imported ones included). The process inspection below reads
/proc directly on purpose: the engine's own `worker.engine.procs` is what is under test.

Every process a test starts is ended by pid at teardown: the processes that carry a
call's marker, the pids a test registers, and the Popen objects it hands over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from worker import Call, CallResult, JobHandle, Policy, Settings, run_call
from worker.engine import sandbox
from worker.engine.environment import MARKER_VAR

T = TypeVar("T")

#: Longest any condition is waited for; far above what a healthy run needs.
DEADLINE_S = 15.0

#: A policy that kills on timeout, quickly: most tests want a finished call.
KILL = Policy(on_timeout="kill", kill_grace_s=0.5)


# ---------------------------------------------------------------------------- waiting


def wait_until(
    predicate: Callable[[], T | None], *, timeout: float = DEADLINE_S, what: str = "a condition"
) -> T:
    """Poll `predicate` until it returns something truthy; return that, or fail the test."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(delay)  # polling interval, not synchronization
        delay = min(delay * 2, 0.05)


# ------------------------------------------------------------------ process inspection


@dataclass(frozen=True)
class Stat:
    """What /proc/<pid>/stat says about a process."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int


def stat(pid: int) -> Stat | None:
    """The process's stat fields; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return Stat(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]))


def alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (zombies hold nothing and run nothing)."""
    info = stat(pid)
    return info is not None and info.state not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries the marker `marker`."""
    needle = f"\0{MARKER_VAR}={marker}\0".encode()
    found = []
    for pid in _all_pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in b"\0" + environ + b"\0" and alive(pid):
            found.append(pid)
    return found


def group_pids(pgid: int) -> list[int]:
    """Live processes in process group `pgid`."""
    return [
        pid for pid in _all_pids() if (s := stat(pid)) is not None
        and s.pgid == pgid and s.state not in ("Z", "X")
    ]


def survivors(marker: str, pgid: int | None = None) -> list[int]:
    """Live processes of a call: carrying its marker or in its group."""
    found = set(marked_pids(marker))
    if pgid is not None:
        found.update(group_pids(pgid))
    return sorted(found)


def create_time(pid: int) -> float | None:
    """psutil's start time of `pid`, or None when it is gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


# ------------------------------------------------------------------------- the janitor


@dataclass
class Janitor:
    """Remembers what a test started and ends all of it, by pid, at teardown."""

    markers: set[str] = field(default_factory=set)
    pids: dict[int, float] = field(default_factory=dict)
    popens: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def new_call_id(self, prefix: str = "t") -> str:
        """A fresh call id, whose marker is swept at teardown."""
        call_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.markers.add(call_id)
        return call_id

    def pid(self, pid: int) -> None:
        """End `pid` at teardown (if it is still the same process)."""
        started = create_time(pid)
        if started is not None:
            self.pids[pid] = started

    def popen(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        """Kill and reap a process the test started itself."""
        self.popens.append(proc)
        return proc

    def job(self, handle: JobHandle) -> None:
        """A background job: its marker, its pid, and its supervisor (the pid's parent)."""
        self.markers.add(handle.id)
        self.pid(handle.pid)
        info = stat(handle.pid)
        if info is not None and info.ppid > 1:
            self.pid(info.ppid)

    def _kill_round(self) -> list[int]:
        targets: set[int] = set()
        for marker in self.markers:
            targets.update(marked_pids(marker))
        for pid, started in self.pids.items():
            if alive(pid) and create_time(pid) == started:
                targets.add(pid)
        targets.discard(os.getpid())
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return sorted(targets)

    def cleanup(self) -> None:
        """SIGKILL everything, re-scanning until nothing is left (forks race the scan)."""
        for proc in self.popens:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while self._kill_round() and time.monotonic() < deadline:
            time.sleep(0.01)  # let the kernel deliver the kills before the next scan


@pytest.fixture(name="janitor")
def _janitor_fixture() -> Iterator[Janitor]:
    janitor = Janitor()
    try:
        yield janitor
    finally:
        janitor.cleanup()


# --------------------------------------------------------------------------- the engine


@dataclass
class Engine:
    """Runs calls with a private state dir, registering every call with the janitor."""

    settings: Settings
    janitor: Janitor
    tmp: Path

    def call(self, command: str, **fields: Any) -> Call:
        """A call with a fresh id; defaults: 30 s timeout, the quick-kill policy."""
        fields.setdefault("call_id", self.janitor.new_call_id())
        fields.setdefault("timeout_s", 30.0)
        fields.setdefault("policy", KILL)
        fields.setdefault("cwd", str(self.tmp))
        return Call(command=command, **fields)

    def run(
        self,
        command: str,
        *,
        on_spawn: Callable[[int, int, str], None] | None = None,
        cancel: threading.Event | None = None,
        on_running: Callable[[], None] | None = None,
        detach: Callable[[], bool] | None = None,
        **fields: Any,
    ) -> CallResult:
        """Run a call to its end and return its result; background jobs are registered."""
        call = self.call(command, **fields)
        self.janitor.markers.add(call.call_id)
        result = run_call(
            call, settings=self.settings, on_spawn=on_spawn, cancel=cancel, on_running=on_running,
            detach=detach,
        )
        if result.job is not None:
            self.janitor.job(result.job)
        return result


def run_user_ids() -> tuple[int, int] | None:
    """(uid, gid) calls run as when this suite runs as root (None: as ourselves)."""
    user = sandbox.run_user(Settings(host="test"))
    return (user.uid, user.gid) if user is not None else None


def give_to_run_user(path: Path) -> None:
    """Make `path` the run user's, as an operator makes a build directory the run user's
    (calls never run as root: they could not write to a directory of root's)."""
    ids = run_user_ids()
    if ids is not None:
        os.chown(path, *ids)


@contextlib.contextmanager
def engine_with(tmp_path: Path, janitor: Janitor, **settings: Any) -> Iterator[Engine]:
    """An engine with these settings (a test may hold two, sharing its directories);
    the sandbox's launchers and idle runners are ended when it is left."""
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    give_to_run_user(work)
    settings.setdefault("workspace_root", tmp_path / "workspaces")
    settings.setdefault("workspace_allow", (str(work),))
    engine = Engine(Settings(state_dir=tmp_path / "state", host="test", **settings), janitor, work)
    try:
        yield engine
    finally:
        sandbox.close_all()


@pytest.fixture(name="engine")
def _engine_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    """The engine as a host runs it by default (sandboxed where bubblewrap works)."""
    with engine_with(tmp_path, janitor) as engine:
        yield engine


@pytest.fixture(name="plain_engine")
def _plain_engine_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    """The engine without a sandbox (`isolation=none`): pids the command prints are the
    host's, and the marker sweep alone finds escapees."""
    with engine_with(tmp_path, janitor, isolation="none") as engine:
        yield engine


class PeakRss:
    """Samples this process's resident set size in a thread; `peak` is the largest seen."""

    def __init__(self, interval: float = 0.005) -> None:
        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        """Bytes the peak rose above the baseline."""
        return self.peak - self.baseline
