"""A workspace's changes and end: delete, restore to a snapshot, a new network
policy, and the reaping of leases.

Workspaces are leases: unused for their TTL (or deleted by their owner), the host reaps
them (`reap`, run by the host supervisor): its keeper killed (so every process in it),
its cgroup and its files removed, its jobs' ends recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from concurrent.futures import Future

from bashfleet.worker.engine import cgroups, sandbox
from bashfleet.worker.engine.isolate import launcher
from bashfleet.worker.engine.jobs import job_records
from bashfleet.worker.engine.network import netlog, network
from bashfleet.worker.engine.snapshots import snapshot_store
from bashfleet.worker.engine.workspaces import (
    blank_pool,
    disk,
    held_groups,
    keeper_calls,
    making,
    store,
    usage,
)
from bashfleet.worker.engine.workspaces.store import WorkspaceError
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import (
    WorkspaceRecord,
    WorkspaceSpec,
)
from bashfleet.worker.wire.network import NetworkPolicy

log = logging.getLogger("bashfleet.workspaces")

#: How long a deletion waits for its cgroup's last processes to go (the kernel ends them
#: once the keeper, pid 1 of their namespace, is killed) before leaving it to the reaper.
CGROUP_GONE_S = 2.0

# --------------------------------------------------------------------------- its end


def delete(ws_id: str, settings: Settings, *, note: str = "its workspace was deleted",
           finish_later: bool = False) -> bool:
    """End a workspace: its keeper killed (so every process in it), its jobs' ends
    recorded, its cgroup and files removed. False when there was none.

    `finish_later`: answer once its keeper is signalled and its record set aside
    (`store.ending_path`: no call, listing or change finds it from then on); the rest
    (its processes' end awaited, its jobs' ends, cgroup and files) goes on in a thread of
    this process that holds the workspace's lock (`store.changing`) until it is done, so
    a change of the same id still waits for all of it. What a process that died left
    half done, the reaper finishes (`reap`)."""
    if not store.valid_id(ws_id):
        return False
    if not finish_later:
        with store.changing(settings, ws_id):
            return _delete_held(ws_id, settings, note)
    answer: Future[bool] = Future()
    threading.Thread(target=_delete_behind, args=(ws_id, settings, note, answer),
                     daemon=True, name=f"bashfleet-delete-{ws_id}").start()
    return answer.result()


def _delete_held(ws_id: str, settings: Settings, note: str) -> bool:
    try:
        record = store.load(ws_id, settings)
    except WorkspaceError:
        store.lock_path(settings, ws_id).unlink(missing_ok=True)
        return False
    keeper_calls.connections.drop(ws_id)
    _end_keeper(record)
    _remove_ended(record, settings, note)
    return True


def _delete_behind(ws_id: str, settings: Settings, note: str, answer: Future[bool]) -> None:
    """`delete(finish_later=True)`'s thread: `answer` is set as soon as the workspace is
    gone for every caller, then its end is finished under the same lock."""
    try:
        with store.changing(settings, ws_id):
            try:
                record = store.load(ws_id, settings)
            except WorkspaceError:
                store.lock_path(settings, ws_id).unlink(missing_ok=True)
                answer.set_result(False)
                return
            keeper_calls.connections.drop(ws_id)
            pidfd = _kill_keeper(record)
            try:
                os.replace(store.record_path(settings, ws_id), store.ending_path(settings, ws_id))
                store.forget(ws_id, settings)
                answer.set_result(True)
                if pidfd is not None:
                    launcher.readable(pidfd, store.KEEPER_END_S)
            finally:
                if pidfd is not None:
                    os.close(pidfd)
            _remove_ended(record, settings, note)
    except BaseException as exc:  # before the answer: the caller's; after it: the reaper's
        if not answer.done():
            answer.set_exception(exc)
        else:
            log.warning("workspace %s: its deletion is left to the reaper: %s", ws_id, exc)


def _remove_ended(record: WorkspaceRecord, settings: Settings, note: str) -> bool:
    """What is left of a workspace whose keeper ended: its jobs' ends recorded, its
    cgroup, files, record (or the record set aside) and lock removed. False when its
    cgroup still held a process after CGROUP_GONE_S (one in the kernel's hands, on a
    busy host): the record then stays set aside (`store.ending_path`), for the reaper
    (`finish_endings`) to remove that cgroup later; gone with the record, the cgroup
    would be nobody's for good (the worker sweeps only the groups it names by pid)."""
    ws_id = record.id
    job_records.end_workspace_jobs(settings, ws_id, note)
    left = [path for path in record.cgroup
            if not cgroups.Group("v2", [(path, ())]).remove(timeout=CGROUP_GONE_S)]
    disk.remove_files(record, settings)
    usage.full_path(settings, ws_id).unlink(missing_ok=True)
    if left:
        with contextlib.suppress(FileNotFoundError):
            os.replace(store.record_path(settings, ws_id), store.ending_path(settings, ws_id))
        store.forget(ws_id, settings)
        log.warning("workspace %s: its cgroup %s still holds a process; the reaper "
                    "removes it later", ws_id, left[0])
        return False
    store.record_path(settings, ws_id).unlink(missing_ok=True)
    store.ending_path(settings, ws_id).unlink(missing_ok=True)
    store.forget(ws_id, settings)
    store.lock_path(settings, ws_id).unlink(missing_ok=True)  # a waiter opens a new one
    return True


def restore(ws_id: str, snap_id: str, settings: Settings) -> tuple[WorkspaceRecord, int]:
    """Put a workspace's files back to a snapshot's: its processes ended (how many, in
    the answer), its own layers replaced by empty ones over the snapshot's; its id,
    path, owner, session, tags and lease kept. WorkspaceError (`invalid`, `not_found`)
    before anything is touched when the snapshot cannot be its. Held against the
    reaper and a deletion throughout (`store.changing`): between its old keeper's end
    and its new one's start it has no sandbox, which is not an end."""
    with store.changing(settings, ws_id):
        return _restore_held(ws_id, snap_id, settings)


def _restore_held(ws_id: str, snap_id: str, settings: Settings
                  ) -> tuple[WorkspaceRecord, int]:
    record = store.load(ws_id, settings)
    try:
        snapshot = snapshot_store.load(snap_id, settings)
    except snapshot_store.SnapshotError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None
    if snapshot.deleted or snapshot.owner != record.owner:
        raise WorkspaceError("not_found", f"no such snapshot on host {settings.host}: "
                             f"{snap_id}")
    base = "host" if record.image is None else f"{record.image.ref}@{record.image.digest}"
    if snapshot.path != record.path or snapshot.base() != base or record.ids is None:
        raise WorkspaceError("invalid", (
            f"snapshot {snap_id} is of a workspace in {snapshot.path} on {snapshot.base()}; "
            f"workspace {ws_id} is in {record.path} on {base}: restore it to a snapshot "
            "of itself (or of one it was made from), or make a new workspace from this one"))
    if snapshot.image is not None:
        making.image_of(WorkspaceSpec(), settings, snapshot)  # held (or pulled) before it is undone
    ended = len(usage.processes(record))
    keeper_calls.connections.drop(ws_id)
    _end_keeper(record)
    job_records.end_workspace_jobs(settings, ws_id, f"its workspace was restored to {snap_id}")
    held = [path for path in record.cgroup
            if not cgroups.Group("v2", [(path, ())]).remove(timeout=CGROUP_GONE_S)]
    if held:  # the new keeper's group takes the name; the reaper removes this one
        moved = held_groups.set_aside(settings, ws_id, held)
        log.warning("workspace %s: its old cgroup still holds a process; set aside as %s "
                    "for the reaper", ws_id, moved[0])
    disk.remove_files(record, settings)
    usage.full_path(settings, ws_id).unlink(missing_ok=True)
    spec = WorkspaceSpec(owner=record.owner, snapshot=snap_id, isolation=record.isolation,
                         network=record.network, ttl_s=record.ttl_s, limits=record.limits,
                         session=record.session, tags=record.tags)
    try:
        made = making.create(spec, settings, ws_id=ws_id)
    except BaseException:
        store.record_path(settings, ws_id).unlink(missing_ok=True)  # nothing of it is left
        raise
    made = made.model_copy(update={"created_at": record.created_at})
    store.save(made, settings)
    return made, ended


def set_network(ws_id: str, policy: NetworkPolicy, settings: Settings) -> WorkspaceRecord:
    """Put another network policy in force in a live workspace (its processes keep
    running; connections the new policy refuses are cut). `host` is the namespace a
    workspace was made in: never changed to or from (WorkspaceError `invalid`)."""
    record = store.load(ws_id, settings)
    if record.keeper_pid is None or not usage.keeper_alive(record):
        raise WorkspaceError("invalid", f"workspace {ws_id} has no sandbox (isolation "
                             f"{record.isolation!r}): its network is the host's")
    if (policy.mode == "host") != (record.network.mode == "host"):
        raise WorkspaceError("invalid", f"workspace {ws_id} was made "
                             f"{'in' if record.network.mode == 'host' else 'out of'} the "
                             "host's network namespace, which a live workspace cannot "
                             "leave or join: make a new one")
    try:
        sandbox.decide(configured=settings.isolation, available=True, reason=None,
                       asked=record.isolation, network=policy,
                       host_network=settings.sandbox_network, rules=sandbox.network_rules(settings))
    except sandbox.IsolationError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None
    with _network_lock:
        state = network.load_state(settings, ws_id)
        try:
            state = network.apply(record.keeper_pid, ws_id, state, policy, settings)
        except (OSError, subprocess.SubprocessError) as exc:
            raise WorkspaceError("spawn_failed", f"could not put network policy {policy} "
                                 f"in force: {exc}") from exc
        finally:
            network.save_state(settings, ws_id, state)
        record = record.model_copy(update={"network": policy})
        store.save(record, settings)
    if policy.mode == "egress" and record.keeper_pid is not None:
        netlog.watch(record.keeper_pid, ws_id, settings)  # its jobs' refusals, from now
    return record


#: One policy change at a time in this process (a change reads, then writes, `<id>.net`).
_network_lock = threading.Lock()


def _end_keeper(record: WorkspaceRecord) -> None:
    pidfd = _kill_keeper(record)
    if pidfd is None:
        return
    try:
        launcher.readable(pidfd, store.KEEPER_END_S)
    finally:
        os.close(pidfd)


def _kill_keeper(record: WorkspaceRecord) -> int | None:
    """SIGKILL its keeper, pid 1 of its namespace (the kernel ends every process in it);
    a descriptor that becomes readable once it is gone (None: it was gone)."""
    if record.keeper_pid is None or not usage.keeper_alive(record):
        return None
    try:
        pidfd = os.pidfd_open(record.keeper_pid)
    except ProcessLookupError:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.keeper_pid, 9)
    return pidfd


def reap(settings: Settings, now: float | None = None) -> list[WorkspaceRecord]:
    """Delete the workspaces unused past their TTL and those whose keeper is gone. The
    host supervisor runs this every few seconds; a workspace held for a change (a
    restore between its keepers) is looked at again on the next round."""
    now = time.time() if now is None else now
    reaped: list[WorkspaceRecord] = []
    for record in store.local_records(settings):
        used = store.last_used(record, settings)
        if used is None:
            continue
        if _reap_note(record, used, now) is None:
            usage.check_disk(record, settings)
            continue
        with store.changing(settings, record.id, wait=False) as held:
            if not held:
                continue
            try:  # as it is now that nothing changes it
                current = store.load(record.id, settings)
            except WorkspaceError:
                continue
            used = store.last_used(current, settings)
            note = None if used is None else _reap_note(current, used, now)
            if note is not None and _delete_held(current.id, settings, note):
                reaped.append(current)
    reaped += finish_endings(settings)
    held_groups.remove_emptied(settings)
    blank_pool.reap_blanks(settings)
    return reaped


def finish_endings(settings: Settings) -> list[WorkspaceRecord]:
    """Finish the deletions set aside that nobody holds: those of a process that died
    before it was done (`delete(finish_later=True)`), and those whose cgroup still held
    a process (`_remove_ended`); the ones finished now."""
    finished = []
    for ws_id in store.ending_ids(settings):
        with store.changing(settings, ws_id, wait=False) as held:
            if not held:
                continue  # still being finished
            record = store.load_ending(ws_id, settings)
            if record is None:
                continue
            _end_keeper(record)
            if _remove_ended(record, settings, "its workspace was deleted"):
                finished.append(record)
    return finished


def _reap_note(record: WorkspaceRecord, used: float, now: float) -> str | None:
    """Why the reaper ends this workspace, last used at `used` (the note its jobs' ends
    get), or None."""
    if now - used > record.ttl_s:
        return "its workspace expired (unused past its TTL)"
    if not usage.keeper_alive(record):
        return "its workspace's sandbox ended"
    return None
