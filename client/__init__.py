"""bashfleet's caller side: the fleet client (`Fleet`, `AsyncFleet`) and its errors.

    from bashfleet.client import Fleet
    result = Fleet().run("make test", host="build-1")

The CLI, the tool dialects and the MCP server are built on these. Names load on first
use (PEP 562): `import bashfleet.client.dialects` does not load the fleet client. No part of the
client loads Celery or kombu: it builds the messages it sends itself
(`bashfleet.worker.wire.messages`).
"""

from __future__ import annotations

import importlib

#: `typing.TYPE_CHECKING` without loading `typing` (`bashfleet --help` does not need it).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from bashfleet.client.aio import AsyncFleet, AsyncWorkspace
    from bashfleet.client.errors import (
        BashfleetError,
        CallNotRun,
        CallRejected,
        FleetUnavailable,
        HostUnavailable,
        ImageError,
        LimitReached,
        OutputTooLarge,
        SessionPinned,
        SnapshotMoveError,
        Unauthorized,
        UnknownCall,
        UnknownJob,
        UnknownSnapshot,
        UnknownWorkspace,
        WaitTimeout,
        WorkerError,
        WorkerLost,
        WorkspaceFileError,
    )
    from bashfleet.client.fleet import Fleet, Workspace
    from bashfleet.worker.wire.models import RestoreResult, Snapshot

__all__ = [
    "AsyncFleet",
    "AsyncWorkspace",
    "BashfleetError",
    "CallNotRun",
    "CallRejected",
    "Fleet",
    "FleetUnavailable",
    "HostUnavailable",
    "ImageError",
    "LimitReached",
    "OutputTooLarge",
    "RestoreResult",
    "SessionPinned",
    "Snapshot",
    "SnapshotMoveError",
    "Unauthorized",
    "UnknownCall",
    "UnknownJob",
    "UnknownSnapshot",
    "UnknownWorkspace",
    "WaitTimeout",
    "WorkerError",
    "WorkerLost",
    "Workspace",
    "WorkspaceFileError",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'bashfleet.client' has no attribute {name!r}")
    homes = {"AsyncFleet": "bashfleet.client.aio", "AsyncWorkspace": "bashfleet.client.aio",
             "Fleet": "bashfleet.client.fleet", "Workspace": "bashfleet.client.fleet",
             "Snapshot": "bashfleet.worker.wire.models", "RestoreResult":
             "bashfleet.worker.wire.models"}
    home = homes.get(name, "bashfleet.client.errors")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
