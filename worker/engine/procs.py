"""Find and end the processes of a call: its process group and every marked escapee.

A call's processes are those in its process group plus those whose environment
carries the call's marker: a `setsid`, `nohup ... &` or double fork leaves the group
but keeps the environment. Zombies count as dead: they hold no resources and only
their parent (or an init that may not reap, in containers) can remove them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import psutil

from bashfleet.worker.engine.environment import MARKER_VAR
from bashfleet.worker.engine.isolate.command_line import read_from_descriptor
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.wire.models import ProcessInfo

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: One read of a /proc file: a stat line is a few hundred bytes.
_PROC_READ = 4096


class Process(Protocol):
    """A started call's bash, as the engine watches it: a Popen, or a call a workspace's
    keeper started (`keeper_calls.WorkspaceProcess`). `pid` is its host pid and process
    group; `wait` and `poll` give Popen's returncode (negative: killed by that signal)."""

    pid: int

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; subprocess.TimeoutExpired past `timeout`."""

    def poll(self) -> int | None:
        """The returncode once ended, else None."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that matter here."""

    pid: int
    state: str
    ppid: int
    pgid: int
    start_ticks: int


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat; None when the process is gone."""
    raw = _read_proc_file(f"/proc/{pid}/stat")
    if raw is None:
        return None
    text = raw.decode("ascii", "replace")
    # The command name is in parentheses and may itself hold spaces and parentheses.
    fields = text[text.rfind(")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        start_ticks=int(fields[19]),
    )


def _read_proc_file(path: str) -> bytes | None:
    """A small /proc file's content; None when it cannot be read (the process is gone).

    Plain os.open/os.read: a buffered file object costs an fstat, an ioctl and two
    lseeks more, on every call and for each process of a sweep.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, _PROC_READ)]
        while len(chunks[-1]) == _PROC_READ:  # rare: more than one read's worth
            chunks.append(os.read(fd, _PROC_READ))
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def shared_writable_files(maps: str) -> list[str]:
    """The files a process maps shared and writable, from its /proc/<pid>/maps text: what
    it can change without a write call, so without the file's times changing at each
    change (only at the first write to a page since it was last written back)."""
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[1][1] == "w" and fields[1][3] == "s" \
                and not fields[5].startswith("["):
            found.append(fields[5])
    return found


def maps_shared_writable(pid: int) -> bool | None:
    """Whether process `pid` maps a file shared and writable (`shared_writable_files`);
    None when its maps cannot be read (it is gone)."""
    raw = _read_proc_file(f"/proc/{pid}/maps")
    if raw is None:
        return None
    return bool(shared_writable_files(raw.decode("utf-8", "replace")))


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def find_call_processes(pgid: int | None, marker: str | None) -> list[int]:
    """Live (non-zombie) processes in group `pgid` or carrying `marker`, ours excluded."""
    needle = f"\0{MARKER_VAR}={marker}\0".encode() if marker else None
    own = os.getpid()
    found: list[int] = []
    for pid in _pids():
        if pid == own:
            continue
        stat = read_stat(pid)
        if stat is None or stat.state in ("Z", "X"):
            continue
        in_group = pgid is not None and stat.pgid == pgid
        if in_group or (needle is not None and _marked(pid, needle)):
            found.append(pid)
    return found


def _marked(pid: int, needle: bytes) -> bool:
    # environ has no NUL before its first variable: add one so that one matches too.
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in b"\0" + handle.read() + b"\0"
    except OSError:
        return False


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to a process group. A group already gone (ESRCH) is success.

    Returns True when the group existed.
    """
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_pid(pid: int, signum: int) -> None:
    """Send `signum` to one process; one already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def wait_gone(pgid: int | None, marker: str | None, timeout: float) -> list[int]:
    """Wait until no process of the call is alive, or `timeout`; return the survivors."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        alive = find_call_processes(pgid, marker)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)


def terminate(
    pgid: int | None, marker: str | None, *, grace_s: float, rounds: int = 5,
    first: int = signal.SIGTERM,
) -> list[int]:
    """End a call: SIGTERM (or `first`), `grace_s` to exit, SIGKILL, then sweep marked
    escapees.

    Returns the pids still alive afterwards (empty unless a process is stuck in the
    kernel or changed its environment to drop the marker and left the group).
    """
    _signal_all(pgid, marker, first)
    alive = wait_gone(pgid, marker, grace_s)
    for _ in range(rounds):
        if not alive:
            return []
        _signal_all(pgid, marker, signal.SIGKILL)
        # A marked process may fork between the scan and the kill: scan again.
        alive = wait_gone(pgid, marker, 1.0)
    return alive


def _signal_all(pgid: int | None, marker: str | None, signum: int) -> list[int]:
    if pgid is not None:
        signal_group(pgid, signum)
    targets = find_call_processes(None, marker) if marker else []
    for pid in targets:
        signal_pid(pid, signum)
    return targets


def start_time(pid: int) -> float | None:
    """Kernel start time of `pid` in seconds since the epoch; None when gone.

    The value psutil's `create_time()` gives (boot time + start ticks / clock ticks),
    from one read of /proc/<pid>/stat: psutil reads the stat file and /proc/stat anew
    on every call, which was a measurable part of a short call's cost.
    """
    try:
        stat = read_stat(pid)
    except (IndexError, ValueError):  # a stat line we cannot parse: let psutil try
        return _psutil_start_time(pid)
    return None if stat is None else _start_time_of(stat)


def _start_time_of(stat: ProcStat) -> float | None:
    boot = boot_time()
    if boot is None:
        return _psutil_start_time(stat.pid)
    # The same operations in the same order as psutil, so the floats are equal.
    return stat.start_ticks / _CLOCK_TICKS + boot


def _psutil_start_time(pid: int) -> float | None:
    """psutil's start time: the fallback when /proc cannot be parsed here."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:  # pragma: no cover - we run as the job's owner
        return None


#: The boot time read from /proc/stat, reused for 10 s. It only moves when the wall
#: clock is stepped; re-reading it now and then follows such a step as psutil would,
#: without reading /proc/stat (a line per CPU) on every call.
_boot_times: TimedMemo[str, float | None] = TimedMemo(ttl_s=10.0)


def ns_pid(pid: int) -> int:
    """`pid` as the innermost PID namespace it is in sees it (its workspace's): the last
    NSpid of its status; `pid` itself when it has no other."""
    raw = _read_proc_file(f"/proc/{pid}/status")
    if raw:
        for line in raw.split(b"\n"):
            if line.startswith(b"NSpid:"):
                return int(line.split()[-1])
    return pid


def boot_time() -> float | None:
    """The host's boot time (seconds since the epoch) from /proc/stat (`btime`), re-read
    every 10 s (at once when missing)."""
    boot = _boot_times.get("btime", _read_boot_time)
    if boot is None:
        _boot_times.forget("btime")
    return boot


def _read_boot_time() -> float | None:
    raw = _read_proc_file("/proc/stat")
    for line in (raw or b"").splitlines():
        if line.startswith(b"btime"):
            with contextlib.suppress(IndexError, ValueError):
                return float(line.split()[1])
    return None


def is_same_process(pid: int, expected_start: float) -> bool:
    """True when `pid` is alive and is the process that started at `expected_start`.

    Guards against pid reuse: an unrelated process that got the same pid later has a
    later start time.
    """
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    actual = _start_time_of(stat)
    return actual is not None and abs(actual - expected_start) < 0.05


def describe(pids: list[int], limit: int = 10) -> tuple[ProcessInfo, ...]:
    """State, CPU and command line of processes, for notices to the model."""
    infos: list[ProcessInfo] = []
    for pid in pids[:limit]:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_times()
                cmdline = " ".join(shown_args(proc.cmdline())) or proc.name()
                infos.append(
                    ProcessInfo(
                        pid=ns_pid(pid),
                        state=proc.status(),
                        cpu_s=round(cpu.user + cpu.system, 2),
                        command=cmdline[:200],
                    )
                )
        except psutil.Error:
            continue
    return tuple(infos)


#: Lines the engine puts before a command (limits, cgroup, session state trap): a
#: notice shows the command as the caller wrote it.
_ENGINE_LINES = re.compile(
    r"\A(?:ulimit [^\n]*bashfleet: could not set resource limits[^\n]*\n"
    r"|echo 0 >&\d+[^\n]*bashfleet: could not join the call cgroup[^\n]*\n"
    r"|exec (?:\d+>&- ?)+\n"
    r"|trap '[^\n]*' EXIT\n)+"
)


def shown_args(args: list[str]) -> list[str]:
    """A call's command line without the lines the engine put before the command."""
    if len(args) >= 3 and os.path.basename(args[0]) == "bash" and args[1] == "-c":
        if read_from_descriptor(args[2]):
            return [*args[:2], "<its command, past 128 KiB, read from a descriptor>"]
        return [*args[:2], _ENGINE_LINES.sub("", args[2]), *args[3:]]
    return args
