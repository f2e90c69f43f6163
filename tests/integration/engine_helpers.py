"""Fixtures and helpers for the engine's integration tests: real processes, always cleaned up.

Test modules import the fixtures they use from here (pytest finds fixtures among a
module's attributes, imported ones included). The process inspection below reads
/proc directly on purpose: the engine's own `bashfleet.worker.engine.procs` is what is under test.

Every process a test starts is ended by pid at teardown: the processes that carry a
call's marker, the pids a test registers, and the Popen objects it hands over.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_IROTH, S_IXUSR
from typing import Any, TypeVar

import psutil
import pytest

from bashfleet.worker import Call, CallResult, JobHandle, Policy, Settings, run_call
from bashfleet.worker.engine import isolate, sandbox, workspaces
from bashfleet.worker.engine.environment import MARKER_VAR
from bashfleet.worker.engine.watcher import CallWatcher, Spawned, Unwatched
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceSpec

T = TypeVar("T")

#: Longest any condition is waited for; far above what a healthy run needs.
DEADLINE_S = 15.0

#: A policy that kills on timeout, quickly: most tests want a finished call.
KILL = Policy(on_timeout="kill", kill_grace_s=0.5)


# ---------------------------------------------------------------------------- waiting


@functools.cache
def readable_install() -> tuple[str, ...]:
    """sys.path entries from which another account (`nobody`) imports `bashfleet` and this
    environment's packages: a tree under /tmp that every account can read, made once per
    test process and removed at its exit. The checkout, and the virtualenv in it, may be
    in a directory only their owner enters (a clone in a `mktemp -d` or a home of mode
    0700 or 0750), where another account reads nothing; so such a test reads nothing
    through the checkout's path. The editable install's import hook is not used there
    (`python -I`, or a sys.path set by hand, reads no .pth file): `bashfleet` is a
    namespace package of the two folders, as setup.py maps them."""
    from bashfleet import client, worker  # noqa: PLC0415

    base = Path(tempfile.mkdtemp(prefix="bashfleet-readable-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    base.chmod(0o755)
    lib, site = base / "lib", base / "site"
    for module in (worker, client):
        folder = Path(module.__file__ or "").parent
        _mirror(folder, lib / "bashfleet" / folder.name)
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    _mirror(Path(site_packages), site)
    for made, _dirs, _files in os.walk(base):
        os.chmod(made, 0o755)  # noqa: S103 - read by another account: the point
    return str(lib), str(site)


def _mirror(source: Path, target: Path) -> None:
    """`source`'s files at `target`: hard links to the files every account may read (no
    bytes copied, modes untouched), readable copies of the others."""
    for folder, _dirs, files in os.walk(source, followlinks=True):
        here = target / Path(folder).relative_to(source)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            origin, copy = Path(folder) / name, here / name
            mode = origin.stat().st_mode
            if mode & S_IROTH:
                with contextlib.suppress(OSError):
                    os.link(origin, copy, follow_symlinks=True)
                    continue
            shutil.copyfile(origin, copy)
            copy.chmod(0o755 if mode & S_IXUSR else 0o644)


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


#: What a keeper that started a call by the spawner holds: the calls' seccomp program,
#: made for the spawner at its first call (a keeper that forks its calls makes none).
SPAWNER_FILTER = "/memfd:bashfleet-seccomp (deleted)"


def ns_pids(record: WorkspaceRecord) -> list[int]:
    """Host pids of every process in the workspace's PID namespace (pid 1's)."""
    assert record.keeper_pid is not None
    ns = os.readlink(f"/proc/{record.keeper_pid}/ns/pid")
    found = []
    for pid in _all_pids():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                found.append(pid)
    return found


def holds_open(record: WorkspaceRecord, target: str, *, besides: int | None = None) -> bool:
    """A process of the workspace's PID namespace (its keeper, or the service beside its
    holder), other than `besides`, holds `target` open (a descriptor's link: a file's
    real path, `SPAWNER_FILTER`)."""
    for pid in ns_pids(record):
        with contextlib.suppress(OSError):
            if pid == besides:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return True
    return False


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


def host_pid(handle: JobHandle) -> int:
    """The host's pid of a job's leader (a sandboxed job's `pid` is its workspace's)."""
    return handle.host_pid if handle.host_pid is not None else handle.pid


def output_dirs(settings: Settings) -> Path:
    """Where every workspace of `settings`' host keeps its calls' spill files and its
    jobs' output: `<workspace root>/.out/<workspace id>/`."""
    return settings.workspace_root_dir() / ".out"


def spill_files(settings: Settings, call_id: str) -> list[Path]:
    """Every spill file of call `call_id`, in whichever workspace it ran (and in the
    state directory's spill directory, where they went before workspaces)."""
    found = list(output_dirs(settings).glob(f"*/{call_id}.*"))
    if settings.spill_dir.exists():
        found += settings.spill_dir.glob(f"{call_id}.*")
    return sorted(found)


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
        """A background job: its marker, its leader, and the leader's parent (its
        supervisor, or its workspace's keeper). By host pid: `handle.pid` is the number
        in its workspace's PID namespace, which on the host is another process."""
        self.markers.add(handle.id)
        pid = host_pid(handle)
        self.pid(pid)
        info = stat(pid)
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
        """A call with a fresh id; defaults: 30 s timeout, the quick-kill policy, and, in
        no session workspace, `tmp` as its cwd (so its throwaway workspace is `tmp`)."""
        fields.setdefault("call_id", self.janitor.new_call_id())
        fields.setdefault("timeout_s", 30.0)
        fields.setdefault("policy", KILL)
        if fields.get("workspace") is None:
            fields.setdefault("cwd", str(self.tmp))
        return Call(command=command, **fields)

    def workspace(self, **spec: Any) -> WorkspaceRecord:
        """A session workspace on the engine's host (a fresh directory unless `path=`);
        it is deleted, with everything running in it, when the engine is left."""
        return workspaces.create(WorkspaceSpec(**spec), self.settings)

    def run(
        self,
        command: str,
        *,
        watcher: CallWatcher | None = None,
        **fields: Any,
    ) -> CallResult:
        """Run a call to its end and return its result; background jobs are registered."""
        call = self.call(command, **fields)
        self.janitor.markers.add(call.call_id)
        result = run_call(call, settings=self.settings, watcher=watcher)
        if result.job is not None:
            self.janitor.job(result.job)
        return result


class Watch(Unwatched):
    """A test's watcher of one call: the events the engine told it, in order, and two
    switches a test (or its own subclass) sets to cancel or detach the call."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.spawns: list[Spawned] = []
        self.cancel = threading.Event()
        self.detach = threading.Event()

    def spawned(self, process: Spawned) -> None:
        self.events.append("spawned")
        self.spawns.append(process)

    def running(self) -> None:
        self.events.append("running")

    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def detach_requested(self) -> bool:
        return self.detach.is_set()


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
    umask = current_umask()
    try:
        yield engine
    finally:
        try:
            end_workspaces(engine.settings)
        finally:
            sandbox.close_all()
            # Workspaces made in two threads at once can leave this process's umask at
            # 0o177 (test_engine_process.py::test_concurrent_workspaces_keep_the_umask
            # shows it): the next tests' directories and keepers would inherit it.
            os.umask(umask)


def current_umask() -> int:
    """This process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _throwaway_threads() -> list[threading.Thread]:
    """The engine's threads that make throwaway workspaces ahead. Not the recycling
    thread (`bashfleet-recycler`): it lives on, waiting for the next workspace, so a test
    that needs a give-back done waits for the pool itself."""
    return [t for t in threading.enumerate()
            if t.name.startswith("bashfleet-throwaway") and t.is_alive()]


def end_workspaces(settings: Settings) -> None:
    """Delete every workspace of `settings`' host (session ones, throwaways made ahead or
    left to the reaper), so every keeper, and every process in it, ends with the test;
    then check that no keeper of its state directory is left."""
    # A thread may be making a throwaway ahead, or recycling one, right now.
    wait_until(lambda: not _throwaway_threads(), what="the throwaway pool's threads")
    workspaces.throwaways.close()
    for record in workspaces.local_records(settings):
        workspaces.delete(record.id, settings)
    sandbox.close_all()
    left = keepers_under(settings.state_dir)
    for pid in left:  # ended (they are this test's), then reported
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"keepers outlived the deletion of every workspace: {left}"


def keepers_under(directory: Path) -> list[int]:
    """Live keepers (and zygotes) whose mounts come from under `directory`: a keeper's view
    binds its /tmp, /var/tmp and HOME from its state directory, so a keeper whose record
    is gone is found too."""
    needle = f" {directory.resolve()}/"
    found = []
    for pid in _all_pids():
        with contextlib.suppress(OSError):
            if not isolate.is_keeper(Path(f"/proc/{pid}/cmdline").read_bytes()):
                continue
            if needle in Path(f"/proc/{pid}/mountinfo").read_text() and alive(pid):
                found.append(pid)
    return found


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


@dataclass
class WitnessEngine(Engine):
    """An engine whose calls may all write `witness` (an operator's writable root), in
    any workspace: where a command that must not run would leave its mark."""

    witness: Path = Path()


@pytest.fixture(name="witness_engine")
def _witness_engine_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[WitnessEngine]:
    """The default engine, plus a directory every call can write (`witness`)."""
    witness = tmp_path / "witness"
    witness.mkdir()
    give_to_run_user(witness)
    with engine_with(tmp_path, janitor, sandbox_writable=(str(witness),)) as engine:
        yield WitnessEngine(engine.settings, engine.janitor, engine.tmp, witness)


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


def fd_holders(target: str) -> set[int]:
    """The pids of the processes with an fd on `target` (as /proc/PID/fd links read)."""
    found = set()
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        found.add(pid)
    return found


@contextlib.contextmanager
def home_for_nobody(prefix: str) -> Iterator[Path]:
    """A home `nobody` reaches (pytest's tmp_path is under root's 0700 folder), removed
    after."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    home.chmod(0o755)
    nobody = pwd.getpwnam("nobody")
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)
