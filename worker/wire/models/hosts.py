"""Worker hosts as the fleet's registry knows them, and the sandbox each gives its
calls."""

from __future__ import annotations

from typing import Literal

from bashfleet.worker.wire.models.base import Isolation, Model


class HostInfo(Model):
    """A worker host as the fleet registry knows it (`bashfleet hosts`)."""

    host: str
    """Host id."""
    alive: bool
    """True while the worker's heartbeat is fresh (it expires seconds after a crash)."""
    ready: bool = False
    """True once both of its consumers (commands and control) take messages."""
    slots: int = 0
    """Command slots (the worker's concurrency)."""
    busy: int = 0
    """Command slots running a call now."""
    queued: int = 0
    """Calls waiting in the host's own command queue (`bashfleet.<host>.exec`, every
    priority) for a free slot. Calls sent to the any or pool queues are not counted."""
    labels: tuple[str, ...] = ()
    """Pool labels: the worker also serves `bashfleet.pool.<label>.exec`."""
    version: str = ""
    """bashfleet version of the worker."""
    pid: int | None = None
    """Process id of the worker's supervisor, on its machine."""
    machine: str = ""
    """Name of the machine the worker runs on."""
    started_at: float | None = None
    """When the worker started (seconds since the epoch, its clock)."""
    heartbeat_at: float | None = None
    """Its last heartbeat (seconds since the epoch, its clock)."""
    sandbox: SandboxProbe | None = None
    """The isolation its calls get (default level, bubblewrap, cgroups, run-as user);
    None when the host's record carries no probe that reads as one."""


class SandboxProbe(Model):
    """What sandbox a host gives its calls (`bashfleet.worker.engine.sandbox.probe`), for
    `hosts`."""

    isolation: Isolation
    """Default isolation of this host's calls (what `auto` resolved to)."""
    configured: Literal["auto", "none", "process", "strict"] = "auto"
    """The host's `isolation` setting."""
    bwrap: str | None = None
    """bubblewrap's version when it works here, e.g. `0.8.0`."""
    problem: str | None = None
    """Why calls run without a sandbox (bubblewrap missing or failing), when they do."""
    cgroup: Literal["v2", "v1"] | None = None
    """The cgroup version calls get a cgroup of their own with; None: ulimit only."""
    cgroup_problem: str | None = None
    """Why calls get no cgroup of their own, when they do not."""
    run_as: str | None = None
    """User the calls run as (None: the worker's own user)."""
    tenancy: Literal["multi", "single"] = "single"
    """`multi`: each workspace has a user namespace mapped to host ids of its own (calls
    are root inside, an id no other workspace has outside); `single`: one uid for every
    workspace (a worker that is not root, or no subordinate ids for the run user)."""
    id_slots: int = 0
    """Workspaces this host can give ids of their own at once (`multi`)."""
    id_range: str | None = None
    """`start:count`: the host ids the operator gave this worker (None: all of the run
    user's subordinate ids)."""
    id_problem: str | None = None
    """Why its workspaces' ids may not be the machine's alone (a container's own lock
    directory and no range of its own), when they may not."""
    network: str = ""
    """Its workspaces' default network policy (`egress`, `none`, `host`)."""
    network_host: bool = False
    """Workspaces may ask for the host's own network namespace (`network_host_ok`)."""
    network_problem: str | None = None
    """Why this host cannot filter workspaces' networks (`egress` and `allow` refused)."""
    seccomp: str = ""
    """The system call filter of its sandboxed calls (`default`: containers-common's
    profile; `unconfined`); empty: calls run unsandboxed, or a worker that does not say."""
    layers: str = ""
    """How a workspace's `/` is made: `overlay` (its own upper layer over the host's
    directories, bound read-only with the host's ids, never idmapped; or over an image),
    `read-only host` (the host's root read-only around its directory); empty: calls run
    unsandboxed, or a worker that does not say."""
