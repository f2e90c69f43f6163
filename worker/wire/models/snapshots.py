"""Snapshots: the record their host keeps, what a client sees, what a restore did."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from bashfleet.worker.wire.models.base import (
    SNAPSHOT_ID_PATTERN,
    WORKSPACE_ID_PATTERN,
    Isolation,
    Model,
    Tags,
)
from bashfleet.worker.wire.models.images import ImageInfo
from bashfleet.worker.wire.models.workspaces import WorkspaceLimits
from bashfleet.worker.wire.network import NetworkPolicy, parse


class SnapshotRecord(Model):
    """A snapshot as its host keeps it: a workspace's own layers, frozen read-only, and
    what they stand on (`bashfleet.worker.engine.snapshots.snapshots`)."""

    id: str = Field(pattern=SNAPSHOT_ID_PATTERN)
    host: str
    """The host whose disk holds it (others fetch it through the fleet's registry)."""
    owner: str = ""
    workspace: str = Field(pattern=WORKSPACE_ID_PATTERN)
    """The workspace it was taken of."""
    created_at: float
    ttl_s: float
    """Seconds it lives from `created_at` (a workspace standing on it keeps its layer)."""
    bytes: int = 0
    """Bytes its own layer holds."""
    tags: Tags = Field(default_factory=dict)
    layers: tuple[str, ...]
    """Its own id, then the snapshots its workspace stood on, newest first: the lower
    layers of a workspace made from it, over its base."""
    path: str
    """Its workspace's directory, in the view: a workspace made from it shows it there."""
    image: ImageInfo | None = None
    """The image its layers stand on (None: the host's root)."""
    user: str | None = None
    home: str | None = None
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    isolation: Isolation = "strict"
    network: Annotated[NetworkPolicy, BeforeValidator(parse)] = NetworkPolicy()
    mounts: dict[str, str] = Field(default_factory=dict)
    """View path -> subdirectory of its directory (relative)."""
    hidden: bool = False
    """Made by `fork` for its forks: not listed; it goes with the last of them."""
    deleted: bool = False
    """Deleted by its owner while workspaces still stand on it: unlisted, its layer kept
    until the last of them ends."""
    pushed: str | None = None
    """Where the fleet's registry holds its layer (`ref@sha256:...`), once pushed."""

    @property
    def expires_at(self) -> float:
        return self.created_at + self.ttl_s

    def base(self) -> str:
        """What its layers stand on: `host` (the host's root) or the image's `ref@digest`."""
        return "host" if self.image is None else f"{self.image.ref}@{self.image.digest}"

    def as_snapshot(self, paused_ms: float | None = None) -> Snapshot:
        """The snapshot as a client sees it."""
        return Snapshot(
            id=self.id, host=self.host, workspace=self.workspace, owner=self.owner,
            created_at=self.created_at, expires_at=self.expires_at, bytes=self.bytes,
            base=self.base(), path=self.path, tags=self.tags, pushed=self.pushed,
            paused_ms=paused_ms,
        )


class Snapshot(Model):
    """A snapshot as a client sees it (`Workspace.snapshot`, `bashfleet snapshot ls`)."""

    id: str
    host: str
    workspace: str
    owner: str = ""
    created_at: float
    expires_at: float
    bytes: int = 0
    base: str = "host"
    """`host` (the host's root) or the image's `ref@sha256:...` its layers stand on."""
    path: str = ""
    """The directory a workspace made from it has (its source's)."""
    tags: Tags = Field(default_factory=dict)
    pushed: str | None = None
    """Its layer in the fleet's registry, once another host asked for it."""
    paused_ms: float | None = None
    """How long its source's processes were paused while it was taken (when it was)."""


class RestoreResult(Model):
    """What `Workspace.restore` did."""

    workspace: str
    snapshot: str
    ended: int
    """Processes of the workspace that were running and were ended (its files went back
    to the snapshot's; none of its processes survive a restore)."""
