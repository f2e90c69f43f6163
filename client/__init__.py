"""bashfleet's caller side: the fleet client (`Fleet`, `AsyncFleet`) and its errors.

    from client import Fleet
    result = Fleet().run("make test", host="build-1")

The CLI, the tool dialects and the MCP server are built on these. Names load on first
use (PEP 562): `import client.dialects` does not load the fleet client. No part of the
client loads Celery or kombu: it builds the messages it sends itself
(`worker.wire.messages`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.aio import AsyncFleet, AsyncWorkspace
    from client.errors import (
        BashfleetError,
        CallNotRun,
        CallRejected,
        FleetUnavailable,
        HostUnavailable,
        ImageError,
        LimitReached,
        OutputTooLarge,
        SessionPinned,
        SnapshotError,
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
    from client.fleet import Fleet, Workspace
    from worker.wire.models import RestoreResult, Snapshot

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
    "SnapshotError",
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
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    homes = {"AsyncFleet": "client.aio", "AsyncWorkspace": "client.aio",
             "Fleet": "client.fleet", "Workspace": "client.fleet",
             "Snapshot": "worker.wire.models", "RestoreResult": "worker.wire.models"}
    home = homes.get(name, "client.errors")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
