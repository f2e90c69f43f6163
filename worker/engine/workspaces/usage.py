"""A workspace's use of the host: its processes, whether its keeper lives, and
its disk usage against its cap.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from bashfleet.worker.engine import isolate, procs
from bashfleet.worker.engine.jobs import job_records, jobs
from bashfleet.worker.engine.workspaces import store
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceView

# -------------------------------------------------------------------------- its state


def processes(record: WorkspaceRecord) -> list[int]:
    """Host pids of the processes running in the workspace (its keeper excluded: pid 1,
    and the keeper beside a holder, which has the zygote's command line; a command that
    takes that command line only hides itself from this count)."""
    if record.keeper_pid is None or not keeper_alive(record):
        return []
    try:
        ns = os.stat(f"/proc/{record.keeper_pid}/ns/pid").st_ino
    except OSError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == record.keeper_pid:
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{name}/ns/pid").st_ino == ns and not isolate.is_keeper(
                    Path(f"/proc/{name}/cmdline").read_bytes()):
                found.append(int(name))
    return found


def keeper_alive(record: WorkspaceRecord) -> bool:
    """True while the workspace's keeper (so its namespaces) lives."""
    if record.keeper_pid is None:
        return record.isolation == "none"
    if record.keeper_start is None:
        return procs.start_time(record.keeper_pid) is not None
    return procs.is_same_process(record.keeper_pid, record.keeper_start)


def disk_bytes(record: WorkspaceRecord, settings: Settings) -> int:
    """Bytes the workspace holds on disk: its directory (when fresh), /tmp, /var/tmp,
    HOME, its output and its own layers (what it changed of its `/`)."""
    state = store.state_path(settings, record.id)
    roots = [state / "tmp", state / "vartmp", state / "home", Path(record.out_dir),
             state / "layer" / "upper"]
    if record.fresh:
        roots.append(Path(record.host_dir()))
    return sum(_tree_bytes(root) for root in roots)


def _tree_bytes(root: Path) -> int:
    total = 0
    seen = 0
    stack = [str(root)]
    while stack and seen < store.USAGE_FILES_LIMIT:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as listing:
            for entry in listing:
                seen += 1
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
    return total


def full_path(settings: Settings, ws_id: str) -> Path:
    """The flag a workspace over its disk cap has (its bytes, when last counted)."""
    return settings.workspaces_dir / f"{ws_id}.full"


def over_disk_cap(record: WorkspaceRecord, settings: Settings) -> int | None:
    """The bytes a workspace held when last counted over its disk cap; None: under it
    (or it has none: no count flags it then)."""
    if record.limits.disk_mb is None:
        return None
    try:
        return int(full_path(settings, record.id).read_text("ascii") or 0)
    except (OSError, ValueError):
        return None


def disk_cap_notice(record: WorkspaceRecord, used: int) -> str:
    """What every call of a workspace over its disk cap is told."""
    cap = record.limits.disk_mb
    return (f"\n[bashfleet: workspace {record.id} holds {used / 2**20:.0f} MiB on disk, past its "
            f"cap of {cap} MiB: its background jobs were stopped and new ones are refused "
            "until files are removed (its directory, /tmp, HOME)]\n")


def check_disk(record: WorkspaceRecord, settings: Settings) -> int | None:
    """Count a capped workspace's bytes; past the cap flag it and stop its background
    jobs (the call that freed space removes the flag at the next count). Its bytes
    when over, else None."""
    cap = record.limits.disk_mb
    if cap is None:
        return None
    used = disk_bytes(record, settings)
    flag = full_path(settings, record.id)
    if used <= cap * 2**20:
        flag.unlink(missing_ok=True)
        return None
    flag.write_text(str(used), encoding="ascii")
    for job in job_records.running_in(settings, record.id):
        jobs.kill_job(job, settings=settings, grace_s=2.0)
        job_records.write_status(job, -15, note=f"stopped: workspace {record.id} passed its "
                                 f"disk cap of {cap} MiB", replace=True)
    return used


def view(record: WorkspaceRecord, settings: Settings, *, count: bool = False) -> WorkspaceView:
    """What a client is shown of it (`count`: its disk bytes and processes too)."""
    used = store.last_used(record, settings)
    return WorkspaceView(
        id=record.id, host=record.host, owner=record.owner, path=record.path,
        isolation=record.isolation, network=record.network, ttl_s=record.ttl_s,
        created_at=record.created_at, last_used_at=used,
        expires_at=None if used is None else used + record.ttl_s, session=record.session,
        tags=record.tags, limits=record.limits, run_as=record.run_as,
        image=f"{record.image.ref}@{record.image.digest}" if record.image is not None else None,
        disk_bytes=disk_bytes(record, settings) if count else None,
        processes=len(processes(record)) if count else None,
        snapshot=record.lowers[0] if record.lowers else None,
    )
