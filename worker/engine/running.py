"""The host's record of its running foreground calls: one small JSON file per call.

`<state_dir>/running/<call_id>.json` (pid, process group, marker, start time) is
written once the call has run 50 ms (most calls end sooner) and removed when it ends;
`<call_id>.detach`, written by the control consumer, asks the engine running the call
(another process) to leave it running as a background job.
A worker that starts after a crash kills the process groups those files name, so a
command whose caller was told "worker lost" does not go on running behind everybody's
back; a cancel and a stop go by them too. The files are the truth even when Redis lost
its data (`bashfleet.worker.fleet.recovery` publishes them again).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from bashfleet.worker.engine import procs
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.names import valid_id

#: Grace between SIGTERM and SIGKILL for calls orphaned by a dead worker.
ORPHAN_GRACE_S = 1.0


class RunningCall(BaseModel):
    """A foreground call whose bash runs now, as recorded on the host's disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    """The call's id (also its marker)."""
    pid: int
    """Process id of the call's bash (its process group leader)."""
    pgid: int
    """Process group id."""
    marker: str
    """Marker value every process of the call carries."""
    start_time: float
    """Kernel start time of `pid`: guards against pid reuse."""
    worker_pid: int
    """Process that runs the call (the exec consumer)."""
    instance: str
    """Worker instance (host lock token) that ran it."""
    kill_grace_s: float = 2.0
    """The call's policy grace between SIGTERM and SIGKILL."""
    owner: str = ""
    """Who the call belongs to (its cancel is its owner's)."""


def directory(settings: Settings) -> Path:
    """Where running-call files live."""
    return settings.state_dir / "running"


def _path(settings: Settings, call_id: str, suffix: str = ".json") -> str:
    # A str, not a Path: built twice on every call, where pathlib costs microseconds.
    return os.path.join(settings.state_dir, "running", call_id + suffix)


def save(settings: Settings, entry: RunningCall) -> None:
    """Record a call's processes, atomically (a reader never sees a partial file).

    Runs on every foreground call: plain os calls, and the directory is made only when
    it is missing (an mkdir on every call failed with EEXIST, a syscall for nothing).
    """
    path = _path(settings, entry.call_id)
    tmp = _path(settings, entry.call_id, ".tmp")
    data = entry.model_dump_json().encode("utf-8")
    try:
        _write_file(tmp, data)
    except FileNotFoundError:
        directory(settings).mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_file(tmp, data)
    os.replace(tmp, path)


def _write_file(path: str, data: bytes) -> None:
    # 0o666 before the umask: the mode pathlib's write_text gave these files.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def remove(settings: Settings, call_id: str) -> None:
    """Forget a call that ended (or became a background job)."""
    for suffix in (".json", ".detach", ".cancel"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_path(settings, call_id, suffix))


def request_cancel(settings: Settings, call_id: str) -> None:
    """Ask the call's engine to kill it (its flag file, `<call_id>.cancel`): for a call
    whose process is not on disk to be killed by pid (an interactive session's first
    wait, a call in its first 50 ms). The engine looks for it at each wake-up."""
    directory(settings).mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_file(_path(settings, call_id, ".cancel"), b"")


def forget_cancel(settings: Settings, call_id: str) -> None:
    """Drop a call's cancel flag (the call ended: nobody looks for it any more)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(settings, call_id, ".cancel"))


class CancelFlag:
    """A call's cancel as its engine sees it (the fleet's `CallWatcher.cancelled`): set
    by `request_cancel`, from the control consumer (another process). One stat a look."""

    def __init__(self, settings: Settings, call_id: str) -> None:
        self._path = _path(settings, call_id, ".cancel")
        self.fired = False
        """It was seen set: the call's end must drop it."""

    def is_set(self) -> bool:
        if not self.fired:
            self.fired = os.path.exists(self._path)
        return self.fired


def request_detach(settings: Settings, call_id: str) -> None:
    """Ask the call's engine to leave it running as a background job (its flag file,
    `<call_id>.detach`, which the engine looks for at each wake-up)."""
    directory(settings).mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_file(_path(settings, call_id, ".detach"), b"")


def detach_requested(settings: Settings, call_id: str) -> bool:
    """True once `request_detach` was called for the call (one stat)."""
    return os.path.exists(_path(settings, call_id, ".detach"))


def load(settings: Settings, call_id: str) -> RunningCall | None:
    """The running call's record, or None."""
    if not valid_id(call_id):
        return None
    try:
        return RunningCall.model_validate_json(Path(_path(settings, call_id)).read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def all_calls(settings: Settings) -> list[RunningCall]:
    """Every running-call record on this host."""
    folder = directory(settings)
    if not folder.is_dir():
        return []
    entries = []
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            entries.append(RunningCall.model_validate_json(path.read_text("utf-8")))
    return entries


def kill(entry: RunningCall, grace_s: float | None = None) -> list[int]:
    """End a call's processes (group, then marked escapees); return survivors."""
    # The group is signalled only while its leader is the very process we started;
    # otherwise the marker sweep alone finds what is left of the call.
    leader_ours = procs.is_same_process(entry.pid, entry.start_time)
    return procs.terminate(
        entry.pgid if leader_ours else None, entry.marker,
        grace_s=entry.kill_grace_s if grace_s is None else grace_s,
    )
