"""The errors a fleet client raises. Catch `BashfleetError` to catch them all.

    BashfleetError                 anything the fleet (not the command) got wrong
    ├── FleetUnavailable           Redis cannot be reached (or no fleet is configured)
    ├── HostUnavailable            no live worker serves the asked host (nothing was sent)
    ├── UnknownJob                 no job or call has that id (or it expired)
    ├── WorkerLost                 the worker died while running the call; the
    │                              command was not run again
    └── CallRejected               the call is invalid (bad arguments); nothing was sent

A command that fails is not an error: its exit code, signal or system error are in
the returned `CallResult`. Messages never show the Redis password.
"""

from __future__ import annotations

__all__ = [
    "BashfleetError",
    "CallRejected",
    "FleetUnavailable",
    "HostUnavailable",
    "UnknownJob",
    "WorkerLost",
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
