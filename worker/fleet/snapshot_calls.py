"""What the snapshot control calls do on a host: take, fork, restore, delete, fetch.

A snapshot's layer and record live on its host's disk
(`bashfleet.worker.engine.snapshots.snapshots`). Redis holds its record sealed by that host
(`bashfleet:snap:<id>`: what a client lists, and what another host trusts when it fetches the
snapshot's layers from the fleet's registry) and its place in its owner's quota of snapshots,
renewed by its host while it is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import redis

from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.snapshots import snapshot_store
from bashfleet.worker.engine.snapshots import snapshots as engine
from bashfleet.worker.fleet import registry, workspace_calls
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.control import (
    SnapshotCreateRequest,
    SnapshotDeleted,
    SnapshotDeleteRequest,
    SnapshotFetch,
    SnapshotFetchRequest,
    WorkspaceCreateRequest,
    WorkspaceForkRequest,
    WorkspaceForks,
    WorkspaceRestoreRequest,
)
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import (
    RestoreResult,
    Snapshot,
    SnapshotRecord,
    WorkspaceSpec,
    WorkspaceView,
)
from bashfleet.worker.wire.owner_keys import for_owner

log = logging.getLogger("bashfleet.worker")

#: Seal purpose of a snapshot's record in Redis.
SNAPSHOT = "snapshot"
#: The owner quota snapshots count in.
QUOTA_KIND = "snapshots"
#: Workspaces a fork makes at once.
FORK_THREADS = 4
#: Seconds a kept snapshot's record outlives the host's next renewal of it.
RECORD_MARGIN_S = 300.0


def publish(rt: Runtime, record: SnapshotRecord) -> None:
    """Write a snapshot's record to Redis, sealed by this host."""
    publish_with(rt.redis, rt.settings.sealing_keys(), record)


def publish_with(client: redis.Redis, keys: Sequence[str], record: SnapshotRecord) -> None:
    """Write a snapshot's record, locked for `keys` and its owner (no other owner reads
    it: `bashfleet.worker.wire.owner_keys`)."""
    ttl = max(int(record.expires_at - time.time()), 0) + int(RECORD_MARGIN_S)
    sealed = auth.lock(for_owner(keys, record.owner), SNAPSHOT, record.id,
                       record.model_dump_json())
    client.set(names.snapshot_key(record.id), sealed, ex=ttl)


def unpublish(client: redis.Redis, record: SnapshotRecord) -> None:
    client.delete(names.snapshot_key(record.id))
    registry.quota_release(client, QUOTA_KIND, record.owner, record.id)


def trusted_record(client: redis.Redis, keys: Mapping[str, str], snap_id: str
                   ) -> SnapshotRecord | None:
    """A snapshot's record as its host sealed it in Redis (None: none, or forged)."""
    sealed = client.get(names.snapshot_key(snap_id))
    if sealed is None:
        return None
    try:
        text = auth.unlock(keys, SNAPSHOT, snap_id, sealed if isinstance(sealed, str)
                           else bytes(sealed).decode("utf-8"))
        return SnapshotRecord.model_validate_json(text)
    except (auth.AuthError, ValueError):
        return None


def _owned(rt: Runtime, snap_id: str, owner: str, admin: bool) -> SnapshotRecord:
    try:
        record = snapshot_store.load(snap_id, rt.settings)
    except snapshot_store.SnapshotError:
        record = None
    if record is None or record.deleted or record.hidden or record.host != rt.settings.host \
            or (record.owner != owner and not admin):
        raise ToolError("not_found", f"no such snapshot on host {rt.settings.host}: {snap_id}")
    return record


def _take(rt: Runtime, ws_id: str, owner: str, admin: bool, *, ttl_s: float | None,
          tags: dict[str, str], hidden: bool) -> tuple[SnapshotRecord, float | None]:
    """Take a snapshot counted against its owner's caps (count, then bytes): past one,
    nothing of it is kept."""
    source = workspace_calls.owned(rt, ws_id, owner, admin)
    snap_id = snapshot_store.new_id()
    limit = rt.settings.limit_snapshots
    quota = registry.quota_acquire(rt.redis, QUOTA_KIND, source.owner, snap_id, limit)
    if not quota.taken:
        raise ToolError("limit", (
            f"owner {source.owner or '(none)'} keeps {quota.held} snapshots, the most allowed "
            f"(BASHFLEET_LIMIT_SNAPSHOTS={limit}); delete one (`bashfleet snapshot rm`)"))
    try:
        record, paused = engine.take(source, rt.settings, ttl_s=ttl_s, tags=tags,
                                     hidden=hidden, snap_id=snap_id)
    except BaseException:
        registry.quota_release(rt.redis, QUOTA_KIND, source.owner, snap_id)
        raise
    cap = rt.settings.limit_snapshot_mb
    if record.id != snap_id:
        # The last fork's snapshot, renewed (`fork_reuse`): it holds its place already,
        # and no byte more.
        registry.quota_release(rt.redis, QUOTA_KIND, source.owner, snap_id)
    elif cap is not None:
        held = _owner_bytes(rt, source.owner, but=snap_id)
        if held + record.bytes > cap * 2**20:
            engine.remove(record.id, rt.settings)
            registry.quota_release(rt.redis, QUOTA_KIND, source.owner, snap_id)
            raise ToolError("limit", (
                f"owner {source.owner or '(none)'}'s snapshots hold {held / 2**20:.0f} MiB; "
                f"this one ({record.bytes / 2**20:.0f} MiB) would pass the cap of {cap} MiB "
                "(BASHFLEET_LIMIT_SNAPSHOT_MB): delete some (`bashfleet snapshot rm`)"))
    publish(rt, record)
    workspaces.touch(source, rt.settings)
    return record, paused


def _owner_bytes(rt: Runtime, owner: str, *, but: str) -> int:
    """Bytes an owner's live snapshots hold across the fleet (from their sealed records)."""
    now_ms = int(time.time() * 1000)
    members = [str(m) for m in rt.redis.zrangebyscore(
        names.quota_key(QUOTA_KIND, registry.owner_space(owner)), now_ms, "+inf")
        if str(m) != but]
    total = 0
    for snap_id in members:
        found = trusted_record(rt.redis, rt.keys, snap_id)
        if found is not None and found.owner == owner:
            total += found.bytes
    return total


def create(rt: Runtime, request: SnapshotCreateRequest, admin: bool = False) -> Snapshot:
    """Snapshot a workspace of the asker's."""
    record, paused = _take(rt, request.workspace, request.owner, admin, ttl_s=request.ttl_s,
                           tags=dict(request.tags), hidden=False)
    return record.as_snapshot(paused)


def fork(rt: Runtime, request: WorkspaceForkRequest, admin: bool = False) -> WorkspaceForks:
    """`n` workspaces from a snapshot of one of the asker's taken now (made for them:
    it goes with the last of them). All or none: a failure ends those made."""
    source = workspace_calls.owned(rt, request.workspace, request.owner, admin)
    workspaces.make_ahead(source, rt.settings, request.n)
    record, paused = _take(rt, source.id, request.owner, admin, ttl_s=engine.HIDDEN_GRACE_S,
                           tags=dict(request.tags), hidden=True)
    spec = WorkspaceSpec(snapshot=record.id, ttl_s=request.ttl_s or source.ttl_s,
                         tags={**source.tags, **request.tags}, session=None)
    ask = WorkspaceCreateRequest(owner=source.owner, spec=spec)
    made: list[WorkspaceView] = []
    try:
        if request.n == 1:
            # On this thread: a pool's thread, started for it, waited to be scheduled
            # (1-3 ms of a `fork(1)` in a busy consumer).
            made.append(workspace_calls.create(rt, ask))
        else:
            _create_at_once(rt, ask, request.n, made)
        workspaces.make_ahead(source, rt.settings, request.n)  # for the next fork
    except BaseException:
        for view in made:
            try:
                ended = workspaces.load(view.id, rt.settings)
                workspaces.delete(view.id, rt.settings)
                workspace_calls.unpublish(rt.redis, ended)
            except Exception as exc:  # the others must still go; the first error is raised
                log.warning("could not end %s of a failed fork: %s", view.id, exc)
        engine.remove(record.id, rt.settings)
        unpublish(rt.redis, record)
        raise
    return WorkspaceForks(snapshot=record.as_snapshot(paused), workspaces=tuple(made))


def _create_at_once(rt: Runtime, ask: WorkspaceCreateRequest, n: int,
                    made: list[WorkspaceView]) -> None:
    """`n` workspaces for `ask`, a few at once (each waits on its keeper building its
    view, a process of its own, so the host's cores make several together), put in
    `made` as they come; the first failure raised once all are in."""
    with ThreadPoolExecutor(min(n, FORK_THREADS), thread_name_prefix="bashfleet-fork") as pool:
        futures = [pool.submit(workspace_calls.create, rt, ask) for _ in range(n)]
        failure: BaseException | None = None
        for future in futures:
            try:
                made.append(future.result())
            except BaseException as exc:  # the first is raised once all are in
                failure = failure or exc
    if failure is not None:
        raise failure


def restore(rt: Runtime, request: WorkspaceRestoreRequest, admin: bool = False
            ) -> RestoreResult:
    """Put a workspace of the asker's back to a snapshot of theirs."""
    source = workspace_calls.owned(rt, request.workspace, request.owner, admin)
    snapshot = snapshot_store.load(request.snapshot, rt.settings) if snapshot_store.valid_id(
        request.snapshot) else None
    if snapshot is None or snapshot.hidden or snapshot.deleted:
        raise ToolError("not_found", f"no such snapshot on host {rt.settings.host}: "
                        f"{request.snapshot}")
    record, ended = workspaces.restore(source.id, request.snapshot, rt.settings)
    workspace_calls.publish(rt, record)
    return RestoreResult(workspace=record.id, snapshot=request.snapshot, ended=ended)


def delete(rt: Runtime, request: SnapshotDeleteRequest, admin: bool = False
           ) -> SnapshotDeleted:
    """Delete a snapshot of the asker's (kept, unlisted, while others stand on it)."""
    try:
        record = _owned(rt, request.id, request.owner, admin)
    except ToolError:
        return SnapshotDeleted(id=request.id, deleted=False)
    deleted = engine.remove(record.id, rt.settings)
    unpublish(rt.redis, record)
    if deleted:
        still = _load_or_none(record.id, rt.settings)
        if still is not None:  # kept for what stands on it: its record stays for fetches
            publish(rt, still)
    return SnapshotDeleted(id=record.id, deleted=deleted)


def _load_or_none(snap_id: str, settings: Settings) -> SnapshotRecord | None:
    try:
        return snapshot_store.load(snap_id, settings)
    except snapshot_store.SnapshotError:
        return None


def reap(settings: Settings, client: redis.Redis) -> int:
    """Remove this host's snapshots that are past their TTL (or deleted, or made for
    forks that are gone) and that nothing stands on; keep the others' records and
    quota places renewed. How many were removed."""
    keys = settings.sealing_keys()
    removed = engine.collect(settings)
    for record in removed:
        if record.host == settings.host:
            unpublish(client, record)
    by_owner: dict[str, list[str]] = {}
    for record in snapshot_store.local_records(settings):
        if record.host != settings.host:
            continue  # fetched from another host: that one publishes it
        publish_with(client, keys, record)
        if not record.deleted:
            by_owner.setdefault(record.owner, []).append(record.id)
    for owner, members in by_owner.items():
        registry.quota_refresh(client, QUOTA_KIND, owner, members)
    if removed:
        log.info("removed %d snapshot(s): %s", len(removed), ", ".join(r.id for r in removed))
    return len(removed)


# ------------------------------------------------------------------ across hosts


@dataclass
class _Move:
    """A push (on the snapshot's host) or a fetch (on another), on a thread of its own."""

    done: threading.Event = field(default_factory=threading.Event)
    pushed: tuple[str, ...] = ()
    error: ToolError | None = None
    finished_at: float | None = None


_moves: dict[str, _Move] = {}
_moves_lock = threading.Lock()
#: Seconds a finished move's outcome is kept for its caller's next question.
KEEP_FINISHED_S = 600.0


def fetch(rt: Runtime, request: SnapshotFetchRequest, admin: bool = False) -> SnapshotFetch:
    """Push a snapshot of the asker's to the fleet's registry (asked of its host), or
    fetch it from there (asked of another host); wait for it at most `wait_s`."""
    record = trusted_record(rt.redis, rt.keys, request.id)
    if record is None or record.deleted or (record.owner != request.owner and not admin):
        raise ToolError("not_found", f"no such snapshot: {request.id}")
    with _moves_lock:
        now = time.monotonic()
        for key, old in list(_moves.items()):
            if old.finished_at is not None and now - old.finished_at > KEEP_FINISHED_S:
                del _moves[key]
        move = _moves.get(request.id)
        if move is None or (move.done.is_set() and move.error is not None):
            move = _moves[request.id] = _Move()
            threading.Thread(target=_run_move, args=(rt, record, move), daemon=True,
                             name=f"snapshot-{request.id}").start()
    move.done.wait(request.wait_s)
    if move.done.is_set() and move.error is not None:
        raise move.error
    return SnapshotFetch(host=rt.settings.host, snapshot=record.id, done=move.done.is_set(),
                         pushed=move.pushed)


def _run_move(rt: Runtime, record: SnapshotRecord, move: _Move) -> None:
    from bashfleet.worker.fleet import snapshot_moves  # noqa: PLC0415 - the registry's tools, when used

    try:
        if record.host == rt.settings.host:
            move.pushed = snapshot_moves.push_chain(rt, record)
        else:
            # A workspace from it is asked for once the pull is done: its blank keeper is
            # made beside the pull, not after it.
            workspaces.make_ahead(record, rt.settings, 1)
            move.pushed = snapshot_moves.fetch_chain(rt, record)
    except ToolError as exc:
        move.error = exc
    except Exception as exc:  # a bug must still end the move, said to its caller
        log.exception("snapshot %s: its move failed inside the worker", record.id)
        move.error = ToolError("internal", f"worker error moving snapshot {record.id}: {exc!r}")
    finally:
        move.finished_at = time.monotonic()
        move.done.set()
