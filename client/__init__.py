"""bashfleet's caller side: the fleet client (`Fleet`, `AsyncFleet`) and its errors.

    from client import Fleet
    result = Fleet().run("make test", host="build-1")

The CLI, the tool dialects and the MCP server are built on these.
"""

from client.errors import (
    BashfleetError,
    CallRejected,
    FleetUnavailable,
    HostUnavailable,
    UnknownJob,
    WorkerLost,
)
from client.fleet import AsyncFleet, Fleet

__all__ = [
    "AsyncFleet",
    "BashfleetError",
    "CallRejected",
    "Fleet",
    "FleetUnavailable",
    "HostUnavailable",
    "UnknownJob",
    "WorkerLost",
]
