"""The errors a fleet client raises. Catch `BashfleetError` to catch them all.

    BashfleetError                 anything the fleet (not the command) got wrong
    ├── FleetUnavailable           Redis cannot be reached (or no fleet is configured)
    ├── HostUnavailable            no live worker serves the asked host (nothing was sent),
    │                              or the host answered it cannot do what was asked
    ├── UnknownJob                 no job (or call that started one) has that id, or no
    │                              call kept output under it (or it expired)
    │   ├── UnknownWorkspace       no workspace has that id (or it ended: deleted, expired)
    │   └── UnknownSnapshot        no snapshot of this owner has that id (deleted, expired)
    ├── UnknownCall                no call has that id (`cancel`, `detach`)
    ├── LimitReached               an owner's cap (live workspaces, background jobs): the
    │                              message says the cap, how many, and when to retry
    ├── WorkerLost                 the worker died while running the call; the
    │                              command was not run again
    ├── CallRejected               the call is invalid (bad arguments); nothing was run
    │   └── SessionPinned          the session's calls run on another host than the one
    │                              asked (`pinned`)
    ├── CallNotRun                 the worker did not run the command: a bad cwd, a
    │                              blocked or invalid call, a refused signature, a spawn
    │                              failure, no worker to take it (`kind`, `result`)
    ├── OutputTooLarge             `run(output="full")`: more output than the max asked
    │                              for (`result` holds the call, its tail shown)
    ├── Unauthorized               the worker refused the message (unsigned, bad
    │                              signature, unknown key, expired, replayed)
    ├── WorkerError                the worker failed inside, or did not answer in time
    ├── WaitTimeout                `wait` gave up before the job ended (it runs on);
    │                              also a TimeoutError
    ├── ImageError                 a host could not pull or remove an image (`kind`:
    │                              invalid reference, not_found, unavailable registry)
    ├── SnapshotMoveError          a snapshot could not be moved to another host through
    │                              the fleet's registry (`kind`: unavailable, invalid)
    └── WorkspaceFileError         a workspace's file operation failed on the file: also
        │                          the OSError a local one raises (`except OSError`)
        ├── WorkspaceFileNotFound      also a FileNotFoundError
        ├── WorkspaceIsADirectory      also an IsADirectoryError
        ├── WorkspaceNotADirectory     also a NotADirectoryError
        ├── WorkspacePermissionError   also a PermissionError
        ├── WorkspaceSpecialFile       a FIFO, a device or a socket, not a file
        └── WorkspaceFileTimeout       not done within its deadline: also a TimeoutError

A command that fails is not an error: its exit code or signal are in the returned
`CallResult` (so is a timeout, and a cancel). A call that did not run at all raises
CallNotRun from `run` / `execute` unless asked `check=False` (then its `error` says
why). Messages never show the Redis password.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bashfleet.worker.wire.models import CallResult

__all__ = [
    "BashfleetError",
    "CallNotRun",
    "CallRejected",
    "FleetUnavailable",
    "HostUnavailable",
    "ImageError",
    "LimitReached",
    "OutputTooLarge",
    "SessionPinned",
    "SnapshotMoveError",
    "Unauthorized",
    "UnknownCall",
    "UnknownJob",
    "UnknownSnapshot",
    "UnknownWorkspace",
    "WaitTimeout",
    "WorkerError",
    "WorkerLost",
    "WorkspaceFileError",
    "WorkspaceFileNotFound",
    "WorkspaceFileTimeout",
    "WorkspaceIsADirectory",
    "WorkspaceNotADirectory",
    "WorkspacePermissionError",
    "WorkspaceSpecialFile",
    "error_for",
]


class BashfleetError(Exception):
    """Base of every error the fleet client raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FleetUnavailable(BashfleetError):  # noqa: N818 - names of the public API
    """Redis cannot be reached, or no fleet is configured."""


class HostUnavailable(BashfleetError):  # noqa: N818 - names of the public API
    """No live worker serves the asked host (or pool): the call was not sent. Or the
    host's worker answered that it cannot do what was asked (`unavailable`: a
    single-tenant host asked for an image, say), its reason the message."""

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host


class UnknownJob(BashfleetError):  # noqa: N818 - names of the public API
    """No job or call has this id, or its record expired."""

    def __init__(self, message: str, item_id: str | None = None) -> None:
        super().__init__(message)
        self.id = item_id


class UnknownCall(BashfleetError):  # noqa: N818 - names of the public API
    """No call has this id (never sent, or its record expired): `cancel`, `detach`."""

    def __init__(self, message: str, call_id: str | None = None) -> None:
        super().__init__(message)
        self.id = call_id


class WorkerLost(BashfleetError):  # noqa: N818 - names of the public API
    """The worker died (or was replaced) while the call ran; it is not run again."""

    def __init__(self, message: str, call_id: str | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.host = host


class CallRejected(BashfleetError):  # noqa: N818 - names of the public API
    """The call is invalid; nothing was sent."""


class SessionPinned(CallRejected):
    """A session call asked for another host than the one its session is pinned to (its
    cwd and files are there); nothing was sent."""

    def __init__(self, message: str, session: str, pinned: str, asked: str) -> None:
        super().__init__(message)
        self.session = session
        self.pinned = pinned
        """The host the session's calls run on."""
        self.asked = asked


class CallNotRun(BashfleetError):  # noqa: N818 - names of the public API
    """The worker did not run the command; `kind` says why (`SystemError_.kind`:
    bad_cwd, spawn_failed, blocked, invalid, unauthorized, unavailable, not_found) and
    `result` is the call's result as the worker answered it."""

    def __init__(self, kind: str, message: str, result: CallResult) -> None:
        super().__init__(message)
        self.kind = kind
        self.result = result


class OutputTooLarge(BashfleetError):  # noqa: N818 - names of the public API
    """`run(..., output="full")` found more output than it may read back; the call ran
    (`result`, its output's tail shown) and its full output stays in its spill files."""

    def __init__(self, message: str, result: CallResult, size: int, limit: int) -> None:
        super().__init__(message)
        self.result = result
        self.size = size
        """Bytes of stdout and stderr the call wrote."""
        self.limit = limit


class Unauthorized(BashfleetError):  # noqa: N818 - names of the public API
    """The worker refused the message: unsigned, badly signed, unknown key, expired or
    replayed. Nothing was run."""


class WorkerError(BashfleetError):
    """The worker failed inside (a bug of ours, reported), or did not answer in time."""


class WaitTimeout(BashfleetError, TimeoutError):  # noqa: N818 - names of the public API
    """`wait` gave up: the job had not ended within the timeout (it keeps running)."""

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message)
        self.id = job_id


class ImageError(BashfleetError):
    """A host could not pull or remove an image; `kind` says why: `invalid` (not an
    image reference, or an image a workspace uses), `not_found` (no such image or tag
    in its registry), `unavailable` (the registry cannot be reached, or refuses the
    host's credentials; or the host lacks the image tools)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


#: The kinds an image request's failure is an ImageError for (the others, such as a
#: refused signature, are the fleet's own errors).
IMAGE_KINDS = frozenset({"invalid", "not_found", "unavailable"})


def image_error_for(kind: str, message: str, file: str | None = None) -> BashfleetError:
    """`error_for` for an image request: its own failures an ImageError."""
    if kind in IMAGE_KINDS:
        return ImageError(kind, message)
    return error_for(kind, message, file)


class SnapshotMoveError(BashfleetError):
    """A snapshot could not go to another host: `unavailable` (the fleet has no registry
    for snapshots, or it cannot be reached or refuses the host), `invalid` (what the
    registry holds is not the snapshot's layer)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def snapshot_error_for(kind: str, message: str, file: str | None = None) -> BashfleetError:
    """`error_for` for a snapshot's move: its registry's failures a SnapshotMoveError."""
    if kind in ("unavailable", "invalid"):
        return SnapshotMoveError(kind, message)
    if kind == "not_found":
        return UnknownSnapshot(message)
    return error_for(kind, message, file)


class UnknownWorkspace(UnknownJob):
    """No workspace has that id on its host (it was deleted, or expired unused)."""


class UnknownSnapshot(UnknownJob):
    """No snapshot of this owner has that id (it was deleted, or expired)."""


class LimitReached(BashfleetError):  # noqa: N818 - names of the public API
    """An owner's cap refused it (live workspaces, background jobs): nothing was made."""


class WorkspaceFileError(BashfleetError, OSError):
    """A workspace's file operation (`read_file`, `write_file`, `upload`, `download`)
    failed on the file itself; the message is the workspace's file tool's, `errno` the
    one a local operation would have set."""

    ERRNO = errno.EIO

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = self.ERRNO


class WorkspaceFileNotFound(WorkspaceFileError, FileNotFoundError):  # noqa: N818
    """No such file or directory in the workspace."""

    ERRNO = errno.ENOENT


class WorkspaceIsADirectory(WorkspaceFileError, IsADirectoryError):  # noqa: N818
    """A file operation named a directory of the workspace."""

    ERRNO = errno.EISDIR


class WorkspaceNotADirectory(WorkspaceFileError, NotADirectoryError):  # noqa: N818
    """A directory operation named a file of the workspace (or a path through one)."""

    ERRNO = errno.ENOTDIR


class WorkspacePermissionError(WorkspaceFileError, PermissionError):
    """The workspace's run user may not read or write it."""

    ERRNO = errno.EACCES


class WorkspaceSpecialFile(WorkspaceFileError):  # noqa: N818
    """A file operation named a FIFO, a device or a socket of the workspace: only
    regular files are read or written (one of those could block or never end)."""

    ERRNO = errno.ENXIO


class WorkspaceFileTimeout(WorkspaceFileError, TimeoutError):  # noqa: N818
    """The file operation did not finish within its deadline (its tool was stopped)."""

    ERRNO = errno.ETIMEDOUT


#: The exception of each `bashfleet.worker.wire.errors.FileProblem`.
FILE_ERRORS: dict[str, type[WorkspaceFileError]] = {
    "missing": WorkspaceFileNotFound,
    "directory": WorkspaceIsADirectory,
    "not_directory": WorkspaceNotADirectory,
    "denied": WorkspacePermissionError,
    "special": WorkspaceSpecialFile,
    "timed_out": WorkspaceFileTimeout,
}


def error_for(kind: str, message: str, file: str | None = None) -> BashfleetError:
    """The typed exception of an error kind a worker answered (`ErrorKind`); a file
    operation's problem with the file (`FileProblem`) as its OSError-like exception."""
    if file in FILE_ERRORS:
        return FILE_ERRORS[file](message)
    by_kind: dict[str, type[BashfleetError]] = {
        "not_found": UnknownJob,
        "invalid": CallRejected,
        "unauthorized": Unauthorized,
        # The host answered that it cannot do this (single-tenant, Redis away from it,
        # its lane full past the request's expiry): the host's word, not a fleet that is
        # down (the answer came through the fleet).
        "unavailable": HostUnavailable,
        "worker_lost": WorkerLost,
        "limit": LimitReached,
    }
    return by_kind.get(kind, WorkerError)(message)
