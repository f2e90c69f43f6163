"""Workspaces: what a caller asks for, what its processes may use, the record its host
keeps and what a client sees."""

from __future__ import annotations

from pydantic import Field

from bashfleet.worker.wire.models.base import (
    MAX_PATH_CHARS,
    OWNER_PATTERN,
    SNAPSHOT_ID_PATTERN,
    WORKSPACE_ID_PATTERN,
    AskedNetwork,
    Isolation,
    KeptNetwork,
    Model,
    Tags,
)
from bashfleet.worker.wire.models.images import ImageInfo


class WorkspaceLimits(Model):
    """What a workspace's processes may use together (None: the host's default)."""

    memory_mb: int | None = Field(None, ge=1)
    """Memory of all its processes (a cgroup where the host makes them)."""
    procs: int | None = Field(None, ge=1)
    """Processes and threads at once."""
    cpus: float | None = Field(None, gt=0)
    """CPUs' worth of time (throttled past it)."""
    disk_mb: int | None = Field(None, ge=1)
    """Bytes on disk: its directory, /tmp, HOME and kept output (past it: a notice on
    every call, background jobs stopped, new ones refused)."""
    open_files: int | None = Field(None, ge=16, le=1 << 20)
    """Files and sockets each of its processes may hold open (RLIMIT_NOFILE, soft and
    hard; the host's `limit_open_files`, 4096 by default, is the most)."""


class WorkspaceSpec(Model):
    """What a caller asks for when it makes a workspace."""

    owner: str = Field("", pattern=OWNER_PATTERN)
    """Who it belongs to (inside the signed message)."""
    path: str | None = Field(None, max_length=MAX_PATH_CHARS)
    """An existing host directory under a root the host allows; None: a fresh one."""
    isolation: Isolation | None = None
    """At least the host's level (None: the host's)."""
    network: AskedNetwork = None
    """Its network policy (`bashfleet.worker.wire.network`): `none`, `egress`, `allow=[...]` or
    `host`; None: the host's default."""
    ttl_s: float | None = Field(None, gt=0, le=30 * 24 * 3600.0)
    """Seconds it lives unused before the host reaps it (None: the host's default)."""
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    """Caps of its processes and disk (lower than the host's, never higher)."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Absolute paths in its calls' view -> subdirectories of the workspace
    (`{"/logs": "logs"}`): Harbor's `/logs`, `/tests`, `/solution`."""
    session: str | None = Field(None, max_length=128)
    """The session it serves, when it is one's."""
    tags: Tags = Field(default_factory=dict)
    """Tags, for listings."""
    near: str | None = Field(None, max_length=MAX_PATH_CHARS)
    """A directory it is made for (a session's first cwd): when no `path` is given and
    this one is under a root the host allows, the project directory holding it (the
    root's child) is the workspace's directory; else a fresh one."""
    image: str | None = Field(None, max_length=1024)
    """An OCI image reference (`python:3.12-slim`, `reg.example:5000/app@sha256:...`): its
    root filesystem is the workspace's `/` (None: the host's own root)."""
    build: str | None = Field(None, max_length=MAX_PATH_CHARS)
    """A directory on the workspace's host holding a Dockerfile: built there, and the
    image it makes is the workspace's `/`."""
    build_network: AskedNetwork = None
    """The network its build's RUN steps get (`none`, `egress`; `host` where the host
    allows it); None: `egress`. Not the workspace's own (`network`)."""
    user: str | None = Field(None, max_length=256)
    """Who its calls run as inside (a name or uid[:gid]; None: the image's USER, else root)."""
    snapshot: str | None = Field(None, pattern=SNAPSHOT_ID_PATTERN)
    """A snapshot it is made from: its files are the snapshot's (over the snapshot's own
    image or host root, which `image`, `build` and `path` may not change), its processes
    none."""


class WorkspaceRecord(Model):
    """A workspace as its host keeps it (its disk record; sealed in Redis)."""

    id: str = Field(pattern=WORKSPACE_ID_PATTERN)
    """Unique across hosts and time."""
    host: str
    """The host it lives on."""
    owner: str = ""
    """Who it belongs to."""
    path: str
    """Its directory: the same path on the host and in its calls' view; a call's default
    cwd."""
    fresh: bool
    """Made by the worker (removed with the workspace), not an existing directory."""
    out_dir: str
    """Where its calls' kept output and its jobs' output go (read-only in its view)."""
    isolation: Isolation
    """Its sandbox: `none` (a directory only), `process` or `strict`."""
    network: KeptNetwork
    """Its network policy, in force (`bashfleet.worker.wire.network`)."""
    ttl_s: float
    """Seconds unused before it is reaped."""
    created_at: float
    """Wall clock time it was made."""
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    """Its caps as granted."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """View path -> host directory bound there."""
    session: str | None = None
    """The session it serves."""
    tags: Tags = Field(default_factory=dict)
    """Tags given when it was made."""
    throwaway: bool = False
    """Made for one call without a session: removed once that call and its jobs end."""
    keeper_pid: int | None = None
    """Host pid of its keeper (pid 1 of its namespaces); None: not sandboxed."""
    keeper_start: float | None = None
    """Start time of the keeper (pid reuse guard)."""
    socket_path: str | None = None
    """The keeper's socket (in the host's state directory)."""
    cgroup: tuple[str, ...] = ()
    """Its cgroup directories."""
    run_as: str | None = None
    """The user its calls run as."""
    image: ImageInfo | None = None
    """The image its `/` is made of (None: the host's root)."""
    ids: tuple[int, int] | None = None
    """(first host id, count) its user namespace maps (None: single-tenant host)."""
    user: str | None = None
    """Who its calls run as inside (None: the image's USER, else root)."""
    home: str | None = None
    """Its calls' HOME inside (ids per workspace): the home its user has in its root's
    /etc/passwd (root's /root)."""
    lowers: tuple[str, ...] = ()
    """The snapshots its files stand on, newest first
    (`bashfleet.worker.engine.snapshots.snapshots`): each a read-only layer under its own,
    over its image or the host's root."""
    dir: str | None = None
    """The host directory behind `path` when they differ: a workspace made from a
    snapshot shows its source's `path`, and keeps what it changes there in a directory
    of its own."""

    def host_dir(self) -> str:
        """Where its directory's files are on the host."""
        return self.dir or self.path


class WorkspaceView(Model):
    """A workspace as a client sees it (`Fleet.workspace`, `bashfleet workspace ls`)."""

    id: str
    host: str
    owner: str = ""
    path: str
    """Its directory (the same path on its host and in its calls)."""
    isolation: Isolation
    network: KeptNetwork
    """Its network policy, in force."""
    ttl_s: float
    created_at: float
    last_used_at: float | None = None
    """When a call, control call or file operation last used it."""
    expires_at: float | None = None
    """When it is reaped unless used before."""
    session: str | None = None
    tags: Tags = Field(default_factory=dict)
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    disk_bytes: int | None = None
    """Bytes it holds on disk, when counted."""
    processes: int | None = None
    """Processes running in it, when counted."""
    run_as: str | None = None
    """The user its calls run as."""
    image: str | None = None
    """The image reference its `/` is made of, with its digest (None: the host's root)."""
    snapshot: str | None = None
    """The snapshot its files were made from, when one (`fork`, `snapshot=`, `restore`)."""
