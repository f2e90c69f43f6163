"""What the integrations share: where and how their workspace is made, and the thread or
task that keeps its lease while the framework holds it.

Every integration is configured from the usual `BASHFLEET_*` settings (the fleet's
Redis URL, the owner: what `Fleet()` reads) with the framework's own configuration as
override: `WorkspaceOptions`, whose fields each framework takes in its own way (mini-swe-
agent's environment config, Harbor's `--ek key=value`, `bashfleet swerex`'s options).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from client.errors import BashfleetError, UnknownWorkspace
from worker.wire.models import WorkspaceLimits

#: Renew a workspace at this fraction of its TTL (and at least this often): a holder
#: that lives renews it well before its host would reap it unused.
RENEW_FRACTION = 1 / 3
RENEW_MAX_S = 600.0


class WorkspaceOptions(BaseModel):
    """The fleet and the workspace an integration uses (None: `Fleet()`'s and the
    host's defaults)."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str | None = None
    """The fleet's Redis (default BASHFLEET_REDIS_URL, else the local fleet's)."""
    owner: str | None = None
    """Whose workspace it is (default BASHFLEET_OWNER, else `user:<login>`)."""
    host: str | None = None
    """The host to make it on."""
    label: str | None = None
    """Else a live host of this pool (else any live host)."""
    path: str | None = None
    """An existing directory under a root the host allows (default: a fresh one)."""
    ttl_s: float | None = Field(None, gt=0)
    """Seconds it lives unused (the host's default: 1 h); renewed while held."""
    isolation: Literal["none", "process", "strict"] | None = None
    """At least the host's sandbox."""
    network: bool | None = None
    """False: its own network namespace (loopback only)."""
    limits: WorkspaceLimits | None = None
    """Memory, processes, CPUs and disk of its processes together."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Absolute paths in its calls' view -> its own subdirectories."""

    @model_validator(mode="after")
    def _one_place(self) -> WorkspaceOptions:
        if self.host is not None and self.label is not None:
            raise ValueError("give a host or a label, not both")
        return self

    def fleet_kwargs(self) -> dict[str, Any]:
        """`Fleet(...)`'s arguments."""
        return {"redis_url": self.redis_url, "owner": self.owner}

    def workspace_kwargs(self, **override: Any) -> dict[str, Any]:
        """`Fleet.workspace(...)`'s arguments (`override` wins: a framework's mounts)."""
        made = {"host": self.host, "label": self.label, "path": self.path,
                "ttl_s": self.ttl_s, "isolation": self.isolation, "network": self.network,
                "limits": self.limits, "mounts": dict(self.mounts)}
        made.update(override)
        return made


def renew_interval(ttl_s: float) -> float:
    """Seconds between two renewals of a workspace that lives `ttl_s` unused."""
    return max(1.0, min(RENEW_MAX_S, ttl_s * RENEW_FRACTION))


class LeaseKeeper:
    """Renews a workspace from a daemon thread until stopped (blocking clients).

    A renewal that fails (the fleet away for a moment) is tried again at the next tick;
    one that finds the workspace gone ends the keeper (the holder finds out on its next
    call, which says so)."""

    def __init__(self, renew: Callable[[], object], ttl_s: float) -> None:
        self._renew = renew
        self._interval = renew_interval(ttl_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bashfleet-lease",
                                        daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):  # a timed wait on the stop event
            if not _renewed(self._renew):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _renewed(renew: Callable[[], object]) -> bool:
    """Renew once; False when the workspace is gone for good."""
    try:
        renew()
    except UnknownWorkspace:
        return False
    except BashfleetError:
        pass  # the fleet away for a moment: the next tick tries again
    return True


async def keep_lease(renew: Callable[[], Any], ttl_s: float) -> None:
    """Renew a workspace until cancelled (asyncio clients): `renew` is a coroutine
    function (`AsyncWorkspace.renew`)."""
    interval = renew_interval(ttl_s)
    while True:
        await asyncio.sleep(interval)
        try:
            await renew()
        except UnknownWorkspace:
            return
        except BashfleetError:
            continue


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task and wait for it to end."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


#: How a workspace's file tools say why a path cannot be read (worker/engine/files.py),
#: and the OSError a local file operation would raise for it.
_FILE_ERRORS: tuple[tuple[str, type[OSError]], ...] = (
    ("No such file or directory", FileNotFoundError),
    ("Is a directory", IsADirectoryError),
    ("Permission denied", PermissionError),
)


def file_error(exc: BashfleetError, path: str) -> OSError | None:
    """The OSError a framework expects for a file operation the workspace refused (a
    missing file comes back as `UnknownWorkspace`, whose message names the cause), or
    None when the cause is not the file's."""
    for words, error in _FILE_ERRORS:
        if words in str(exc):
            return error(f"{words}: {path}")
    return None
