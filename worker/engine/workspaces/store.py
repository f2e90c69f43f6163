"""Workspace records and where each workspace's files are on this host.

A record is a JSON file in the state directory (`workspaces/<id>.json`, its mtime the
time the workspace was last used), beside its keeper's socket and its private /tmp,
/var/tmp and HOME; a deletion that answered before its files were gone sets the record
aside as `<id>.ending` until they are. This module reads and writes them (with a cache
keyed by the file's mtime) and names the paths; it makes and ends nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import (
    WorkspaceRecord,
)

#: How often a workspace's keeper looks at its lease, and how long past its TTL (or its
#: record's removal) it ends the workspace itself when no worker of its host did.
LEASE_LOOK_S = 30.0
LEASE_GRACE_S = 300.0
#: Seconds a workspace deletion waits for its keeper (and so its processes) to be gone.
KEEPER_END_S = 10.0
#: Most bytes a disk usage count looks at files for before it stops counting.
USAGE_FILES_LIMIT = 200_000


class WorkspaceError(ToolError):
    """A workspace could not be made, found or used."""


def new_id() -> str:
    """A workspace id unique across hosts and time."""
    return f"w{uuid.uuid4().hex[:15]}"


# ------------------------------------------------------------------------------ paths


def record_path(settings: Settings, ws_id: str) -> Path:
    """The workspace's record."""
    return settings.workspaces_dir / f"{ws_id}.json"


def ending_path(settings: Settings, ws_id: str) -> Path:
    """The record of a workspace being deleted, set aside where no look-up finds it
    (`lifecycle.delete(finish_later=True)`) until its files are gone."""
    return settings.workspaces_dir / f"{ws_id}.ending"


def state_path(settings: Settings, ws_id: str) -> Path:
    """Its private /tmp, /var/tmp, HOME, and the mount point of its view's root."""
    return settings.workspaces_dir / ws_id


def lock_path(settings: Settings, ws_id: str) -> Path:
    """The file whose lock a change of the whole workspace holds (`changing`)."""
    return settings.workspaces_dir / f"{ws_id}.lock"


@contextlib.contextmanager
def changing(settings: Settings, ws_id: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold the workspace for a change no other process or thread of this host may see
    half done: a restore (its keeper ended, its files gone, a new keeper not yet made)
    must not look to the host supervisor's reaper like a workspace whose sandbox ended.
    Yields True once held; with `wait=False`, False at once when another holds it. The
    lock is the kernel's (flock): a holder that dies lets go."""
    if not valid_id(ws_id):  # never a path out of its folder
        raise WorkspaceError("not_found", f"no such workspace: {ws_id!r}")
    path = lock_path(settings, ws_id)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:  # its folder is gone: nothing of it is left to change
            yield True
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file a deletion unlinked while this waited for it
            break
        os.close(fd)
    try:
        yield True
    finally:
        os.close(fd)


def socket_path(settings: Settings, ws_id: str) -> Path:
    """Its keeper's socket."""
    return settings.workspaces_dir / f"{ws_id}.sock"


def out_dir(settings: Settings, ws_id: str) -> Path:
    """Where its output files go (the same path in its view, read-only there)."""
    return settings.workspace_root_dir() / ".out" / ws_id


# --------------------------------------------------------------------------- records


def save(record: WorkspaceRecord, settings: Settings) -> None:
    """Write the record atomically (its mtime is its last use)."""
    path = record_path(settings, record.id)
    tmp = path.with_name(f".{record.id}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(record.model_dump_json())
    os.replace(tmp, path)
    forget(record.id, settings)


def forget(ws_id: str, settings: Settings) -> None:
    """Drop the cached record of `ws_id` (written again, or removed)."""
    _loaded.pop((settings.workspaces_dir, ws_id), None)


#: (directory, id) -> (mtime, record): a call reads its workspace's record once (a stat
#: after that), not a JSON parse per call.
_loaded: dict[tuple[Path, str], tuple[int, WorkspaceRecord]] = {}


def load(ws_id: str, settings: Settings) -> WorkspaceRecord:
    """The record of workspace `ws_id` on this host; WorkspaceError `not_found`."""
    if not valid_id(ws_id):
        raise WorkspaceError("not_found", f"no such workspace: {ws_id!r}")
    path = record_path(settings, ws_id)
    try:
        mtime = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        raise WorkspaceError("not_found", f"no such workspace on host {settings.host}: "
                             f"{ws_id}") from None
    cached = _loaded.get((settings.workspaces_dir, ws_id))
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        record = WorkspaceRecord.model_validate_json(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise WorkspaceError("not_found", f"workspace {ws_id} is unreadable: {exc}") from None
    _loaded[(settings.workspaces_dir, ws_id)] = (mtime, record)
    return record


def valid_id(ws_id: str) -> bool:
    return len(ws_id) == 16 and ws_id[0] == "w" and all(c in "0123456789abcdef" for c in ws_id[1:])


def local_records(settings: Settings) -> list[WorkspaceRecord]:
    """Every workspace record kept on this host."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(settings.workspaces_dir):
            if entry.name.endswith(".json") and valid_id(entry.name[:-5]):
                with contextlib.suppress(WorkspaceError):
                    found.append(load(entry.name[:-5], settings))
    return found


def ending_ids(settings: Settings) -> list[str]:
    """The workspaces whose deletion is not finished (their records set aside)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(settings.workspaces_dir) as found:
        return sorted(entry.name[:-7] for entry in found
                      if entry.name.endswith(".ending") and valid_id(entry.name[:-7]))
    return []


def load_ending(ws_id: str, settings: Settings) -> WorkspaceRecord | None:
    """The record a deletion set aside (None: none, or unreadable)."""
    try:
        return WorkspaceRecord.model_validate_json(
            ending_path(settings, ws_id).read_text("utf-8"))
    except (OSError, ValueError):
        return None


def touch(record: WorkspaceRecord, settings: Settings) -> None:
    """Mark it used now (a call, a control call, a file operation, `renew`)."""
    path = record_path(settings, record.id)
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)
        _loaded[(settings.workspaces_dir, record.id)] = (os.stat(path).st_mtime_ns, record)


def last_used(record: WorkspaceRecord, settings: Settings) -> float | None:
    """When it was last used (None: its record is gone)."""
    try:
        return os.stat(record_path(settings, record.id)).st_mtime
    except FileNotFoundError:
        return None


