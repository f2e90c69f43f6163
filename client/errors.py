"""The errors a fleet client raises. Catch `BashfleetError` to catch them all.

    BashfleetError                 anything the fleet (not the command) got wrong
    ├── FleetUnavailable           Redis cannot be reached (or no fleet is configured)
    ├── HostUnavailable            no live worker serves the asked host (nothing was sent)
    ├── UnknownJob                 no job or call has that id (or it expired)
    ├── WorkerLost                 the worker died while running the call; the
    │                              command was not run again
    ├── CallRejected               the call is invalid (bad arguments); nothing was run
    ├── Unauthorized               the worker refused the message (unsigned, bad
    │                              signature, unknown key, expired, replayed)
    ├── WorkerError                the worker failed inside, or did not answer in time
    └── WaitTimeout                `wait` gave up before the job ended (it runs on);
                                   also a TimeoutError

A command that fails is not an error: its exit code, signal or system error are in
the returned `CallResult`. Messages never show the Redis password.
"""

from __future__ import annotations

__all__ = [
    "BashfleetError",
    "CallRejected",
    "FleetUnavailable",
    "HostUnavailable",
    "Unauthorized",
    "UnknownJob",
    "WaitTimeout",
    "WorkerError",
    "WorkerLost",
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
    """No live worker serves the asked host (or pool); the call was not sent."""

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host


class UnknownJob(BashfleetError):  # noqa: N818 - names of the public API
    """No job or call has this id, or its record expired."""

    def __init__(self, message: str, item_id: str | None = None) -> None:
        super().__init__(message)
        self.id = item_id


class WorkerLost(BashfleetError):  # noqa: N818 - names of the public API
    """The worker died (or was replaced) while the call ran; it is not run again."""

    def __init__(self, message: str, call_id: str | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.host = host


class CallRejected(BashfleetError):  # noqa: N818 - names of the public API
    """The call is invalid; nothing was sent."""


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


def error_for(kind: str, message: str) -> BashfleetError:
    """The typed exception of an error kind a worker answered (`ErrorKind`)."""
    by_kind: dict[str, type[BashfleetError]] = {
        "not_found": UnknownJob,
        "invalid": CallRejected,
        "unauthorized": Unauthorized,
        "unavailable": FleetUnavailable,
        "worker_lost": WorkerLost,
    }
    return by_kind.get(kind, WorkerError)(message)
