"""What a call or a workspace may use: cgroups, ulimits and the output cap, from settings.

A workspace's processes share one cgroup (memory, processes, CPU) where this worker may
make one (cgroup v2 delegated to it, or v1 as root); the keeper joins it before it forks
anything, so every call and job is born inside. Where no cgroup can be made, bash sets
the same limits with `ulimit` on a line of its startup script (per process, weaker).
The file size limit is always a ulimit; the output cap is watched by whoever holds the
call's output files (`bashfleet.worker.engine.isolate.proto.CapWatch`).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import threading

from bashfleet.worker.engine import cgroups, limits
from bashfleet.worker.engine.isolate import kernel
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceLimits


def host_limits(settings: Settings) -> limits.ResourceLimits:
    """This host's per-call resource limits."""
    return limits.ResourceLimits(
        memory_mb=settings.limit_memory_mb, cpu_s=settings.limit_cpu_s,
        file_mb=settings.limit_file_mb, procs=settings.limit_procs,
    )


def granted(asked: WorkspaceLimits, settings: Settings) -> WorkspaceLimits:
    """A workspace's limits: what it asked for, never above the host's (the host's where
    it asked for none)."""
    def lower(want: float | None, cap: float | None) -> float | None:
        if want is None:
            return cap
        return want if cap is None else min(want, cap)

    memory = lower(asked.memory_mb, settings.limit_memory_mb)
    procs = lower(asked.procs, settings.limit_procs)
    disk = lower(asked.disk_mb, settings.limit_workspace_mb)
    files = lower(asked.open_files, settings.limit_open_files)
    return WorkspaceLimits(
        open_files=None if files is None else int(files),
        memory_mb=None if memory is None else int(memory),
        procs=None if procs is None else int(procs),
        cpus=lower(asked.cpus, settings.limit_cpus),
        disk_mb=None if disk is None else int(disk),
    )


def cgroup_limits(granted_limits: WorkspaceLimits) -> cgroups.CgroupLimits:
    """The limits a workspace's cgroup carries."""
    return _cgroup_limits(granted_limits.memory_mb, granted_limits.procs, granted_limits.cpus)


@functools.lru_cache(maxsize=64)
def _cgroup_limits(
    memory_mb: int | None, pids: int | None, cpus: float | None
) -> cgroups.CgroupLimits:
    memory = memory_mb * 1024 * 1024 if memory_mb is not None else None
    return cgroups.CgroupLimits(memory_bytes=memory, pids=pids, cpus=cpus)


def host_cgroup_limits(settings: Settings) -> cgroups.CgroupLimits:
    """The cgroup limits of a call that asked for none."""
    return _cgroup_limits(settings.limit_memory_mb, settings.limit_procs, settings.limit_cpus)


_cgroup_support: TimedMemo[tuple[str, tuple[str, ...]], cgroups.Support] = TimedMemo(ttl_s=3600.0)


def cgroup_support(settings: Settings, wanted: tuple[str, ...]) -> cgroups.Support:
    """Whether this process can make cgroups with the `wanted` controllers (found out
    once per process and set of controllers, then remembered)."""
    if settings.cgroups == "off" or not wanted:
        reason = "cgroups are off (settings)" if wanted else "no limit needs a cgroup"
        return cgroups.Support(None, problem=reason)
    return _cgroup_support.get((settings.cgroups, wanted), lambda: _detect(wanted))


def cgroup_plan(settings: Settings) -> tuple[cgroups.CgroupLimits, cgroups.Support]:
    """The host's default cgroup limits and whether this process can make groups for them."""
    carried = host_cgroup_limits(settings)
    return carried, cgroup_support(settings, carried.controllers())


def blank_group(settings: Settings, name: str) -> cgroups.Group | None:
    """A cgroup with every controller a workspace may need and no limit yet (a blank
    keeper's: its workspace's limits are written when it is claimed)."""
    support = _blank_support(settings)
    if support.version is None:
        return None
    return cgroups.create(support, cgroups.CgroupLimits(), name=name)


def blank_group_paths(settings: Settings, name: str) -> list[str]:
    """The directories `blank_group(settings, name)` makes (none made here): what a
    blank's note names before they exist."""
    support = _blank_support(settings)
    if support.version is None:
        return []
    return [os.path.join(item.base, name) for item in support.hierarchies]


def _blank_support(settings: Settings) -> cgroups.Support:
    support = cgroup_support(settings, cgroups.CONTROLLERS)
    if support.version == "v1":
        # v1's freezer is a hierarchy of its own (v2 has one in every group): a directory
        # there lets a snapshot pause the workspace's processes for its instant.
        frozen = cgroup_support(settings, (*cgroups.CONTROLLERS, "freezer"))
        if frozen.version == "v1":
            support = frozen
    return support


def ulimit_limits(settings: Settings, carried_by_cgroup: bool) -> limits.ResourceLimits:
    """The limits the ulimit line sets: all but those a cgroup carries."""
    host = host_limits(settings)
    if not carried_by_cgroup:
        return host
    carried = host_cgroup_limits(settings)
    return dataclasses.replace(
        host,
        memory_mb=None if carried.memory_bytes is not None else host.memory_mb,
        procs=None if carried.pids is not None else host.procs,
    )


def ulimit_line(settings: Settings, carried_by_cgroup: bool,
                open_files: int | None = None) -> str:
    """The ulimit line of a call's startup script (`limits.ulimit_prefix`); with
    `open_files`, RLIMIT_NOFILE too (for a call no keeper starts: a keeper sets its
    workspace's for every process it starts, `bashfleet.worker.engine.isolate.kernel.spawn`)."""
    chosen = ulimit_limits(settings, carried_by_cgroup)
    if open_files is not None:
        chosen = dataclasses.replace(chosen, open_files=kernel.lowered_nofile(open_files))
    return _ulimit_line(chosen)


@functools.lru_cache(maxsize=64)
def _ulimit_line(chosen: limits.ResourceLimits) -> str:
    return limits.ulimit_prefix(chosen)


def output_cap(settings: Settings) -> int | None:
    """Bytes of output one call or job may write; None: no cap."""
    mib = settings.limit_output_mb
    return None if mib is None else mib * 1024 * 1024


_group_pools: dict[tuple[cgroups.Support, cgroups.CgroupLimits], cgroups.GroupPool] = {}
_pools_lock = threading.Lock()


def group_pool(settings: Settings) -> cgroups.GroupPool | None:
    """The pool of cgroups for unsandboxed calls (isolation `none`); None: no cgroups."""
    carried, support = cgroup_plan(settings)
    if support.version is None:
        return None
    key = (support, carried)
    with _pools_lock:
        pool = _group_pools.get(key)
        if pool is None:
            pool = _group_pools[key] = cgroups.GroupPool(support, carried, settings.concurrency)
    return pool


def _detect(wanted: tuple[str, ...]) -> cgroups.Support:
    support = cgroups.detect(wanted)
    if support.version is not None:
        cgroups.sweep(support, _alive)
        _made.append(support)
    return support


#: Where this process made groups: at its exit, the empty ones of its own are removed.
_made: list[cgroups.Support] = []


@atexit.register
def _sweep_own() -> None:
    own = os.getpid()
    for support in _made:
        cgroups.sweep(support, lambda pid: pid != own and _alive(pid))
    with _pools_lock:
        pools = list(_group_pools.values())
        _group_pools.clear()
    for pool in pools:
        pool.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
