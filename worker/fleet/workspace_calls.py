"""What the workspace control calls do on the owning host, and their Redis records.

A workspace's record lives on its host's disk (`bashfleet.worker.engine.workspaces`); Redis holds
what clients list: its view, sealed by the host (`bashfleet:ws:<id>`), and its place in
its owner's quota of workspaces (`bashfleet.worker.fleet.registry.quota_acquire`: one Lua script,
so many orchestrator processes sharing an owner cannot pass `BASHFLEET_LIMIT_WORKSPACES`
together), which its host renews while it lives; a dead host's drop out.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence

import redis

from bashfleet.worker.engine import files
from bashfleet.worker.engine import workspaces as engine
from bashfleet.worker.engine.images import images
from bashfleet.worker.fleet import lanes, registry
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.control import (
    FileChunk,
    FileReadRequest,
    FileWriteRequest,
    FileWritten,
    WorkspaceCreateRequest,
    WorkspaceDeleted,
    WorkspaceDeleteRequest,
    WorkspaceList,
    WorkspaceNetworkRequest,
    WorkspaceRenewRequest,
    WorkspacesRequest,
)
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.events import denied_event, seal_event
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceView
from bashfleet.worker.wire.owner_keys import for_owner

log = logging.getLogger("bashfleet.worker")

#: Seconds a workspace's Redis records outlive its expiry (a host reaps it within a
#: minute of it; its listing must not drop it before).
RECORD_MARGIN_S = 120.0
#: Seal purpose of a workspace's view in Redis.
WORKSPACE = "workspace"
#: The owner quota workspaces count in (`bashfleet.worker.fleet.registry.quota_acquire`).
QUOTA_KIND = "workspaces"


def _admit(rt: Runtime, owner: str, ws_id: str) -> None:
    """Count a new workspace against its owner's cap, or refuse it (`limit`)."""
    limit = rt.settings.limit_workspaces
    quota = registry.quota_acquire(rt.redis, QUOTA_KIND, owner, ws_id, limit)
    if not quota.taken:
        raise ToolError("limit", (
            f"owner {owner or '(none)'} has {quota.held} live workspaces, the most allowed "
            f"(BASHFLEET_LIMIT_WORKSPACES={limit}); delete one (`bashfleet workspace rm`), "
            f"or retry once one ends (the soonest in {quota.retry_after_s:.0f}s unless used)"))


def publish(rt: Runtime, record: WorkspaceRecord) -> WorkspaceView:
    """Write the workspace's view to Redis (sealed) and its expiry to the owner's index."""
    view = engine.view(record, rt.settings)
    expires = view.expires_at or time.time() + record.ttl_s
    ttl = max(1, int(expires - time.time() + RECORD_MARGIN_S))
    # Locked for its owner, the workers and the admin: no other owner reads it.
    owners = for_owner(rt.settings.sealing_keys(), record.owner)
    sealed = auth.lock(owners, WORKSPACE, record.id, view.model_dump_json())
    rt.redis.set(names.workspace_key(record.id), sealed, ex=ttl)
    return view


def unpublish(client: redis.Redis, record: WorkspaceRecord) -> None:
    """Drop a workspace that ended from Redis (its view, its place in the quota)."""
    client.delete(names.workspace_key(record.id))
    registry.quota_release(client, QUOTA_KIND, record.owner, record.id)


def owned(rt: Runtime, ws_id: str, owner: str, admin: bool) -> WorkspaceRecord:
    """A workspace of this host, for its owner (or an admin); another's is unknown."""
    try:
        record = engine.load(ws_id, rt.settings)
    except engine.WorkspaceError:
        record = None
    if record is None or (record.owner != owner and not admin) or record.throwaway:
        raise ToolError("not_found", f"no such workspace on host {rt.settings.host}: {ws_id}")
    return record


def create(rt: Runtime, request: WorkspaceCreateRequest, admin: bool = False) -> WorkspaceView:
    """Make a workspace for the asker (counted against their cap first)."""
    del admin
    if not request.pull and request.spec.image is not None:
        _require_held(rt.settings, request.spec.image)
    spec = request.spec.model_copy(update={"owner": request.owner})
    admitted: list[str] = []

    def admit(ws_id: str) -> None:
        _admit(rt, request.owner, ws_id)
        admitted.append(ws_id)

    try:
        # Admitted under the id its blank keeper holds ready: no cgroup renamed at claim.
        record = engine.create(spec, rt.settings, admit=admit)
    except BaseException:
        for ws_id in admitted:
            registry.quota_release(rt.redis, QUOTA_KIND, request.owner, ws_id)
        raise
    return publish(rt, record)


def _require_held(settings: Settings, ref: str) -> None:
    """ToolError `not_found` at once unless this host holds the image `ref` names (a
    reference it cannot read: its `invalid`), so a create that may not pull never does."""
    if images.find(ref, settings) is None:
        raise ToolError("not_found", f"image {ref} is not held on host {settings.host}: "
                        "pull it first (`bashfleet images pull`)")


def delete(rt: Runtime, request: WorkspaceDeleteRequest, admin: bool = False) -> WorkspaceDeleted:
    """End a workspace of the asker's: answered once it is gone for every caller, its
    processes' end awaited and its files removed after the answer (`finish_later`)."""
    record = owned(rt, request.id, request.owner, admin)
    deleted = engine.delete(record.id, rt.settings, finish_later=True)
    unpublish(rt.redis, record)
    return WorkspaceDeleted(id=record.id, deleted=deleted)


def renew(rt: Runtime, request: WorkspaceRenewRequest, admin: bool = False) -> WorkspaceView:
    """Mark a workspace used now; its view (counted, when asked)."""
    record = owned(rt, request.id, request.owner, admin)
    engine.touch(record, rt.settings)
    view = publish(rt, record)
    return engine.view(record, rt.settings, count=True) if request.count else view


def set_network(rt: Runtime, request: WorkspaceNetworkRequest,
                admin: bool = False) -> WorkspaceView:
    """Put another network policy in force in a workspace of the asker's."""
    record = owned(rt, request.id, request.owner, admin)
    record = engine.set_network(record.id, request.network, rt.settings)
    engine.touch(record, rt.settings)
    return publish(rt, record)


def publish_denied(settings: Settings, client: redis.Redis, keys: Sequence[str],
                   offsets: dict[str, int]) -> int:
    """Publish what the workspaces' network policies refused since the last look (their
    `.denied` files, from `offsets`) as `denied` events, each locked for its workspace's
    owner as its jobs' events are (its owner's own key opens it: `bashfleet events
    --kind denied` with an owner key lists its refusals) and carrying its tags; how many.
    A throwaway workspace serves one owner's call, then another's: its refusals are
    locked for the workers and the admin only (its call's result names them)."""
    sent = 0
    for path in settings.workspaces_dir.glob("w*.denied"):
        ws_id = path.name[:-len(".denied")]
        try:
            size = path.stat().st_size
            if size <= offsets.get(ws_id, 0):
                continue
            with path.open("rb") as handle:
                handle.seek(offsets.get(ws_id, 0))
                data = handle.read(min(size - offsets.get(ws_id, 0), 1 << 20))
        except OSError:
            continue
        complete = data[:data.rfind(b"\n") + 1]
        offsets[ws_id] = offsets.get(ws_id, 0) + len(complete)
        owner, tags = _owner_and_tags(settings, ws_id)
        sealing = for_owner(keys, owner) if owner else tuple(keys)
        for line in complete.splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                event = denied_event(ws_id, settings.host, float(entry["at"]),
                                     str(entry["target"]), str(entry["kind"]), tags=tags)
                sealed = seal_event(sealing, event)
                stream_id = client.xadd(names.EVENTS_KEY, {"e": sealed},
                                        maxlen=names.EVENTS_MAXLEN, approximate=True)
                if isinstance(stream_id, bytes):
                    stream_id = stream_id.decode()
                client.publish(names.EVENTS_CHANNEL, f"{stream_id}\n{sealed}")
                sent += 1
    for gone in set(offsets) - {p.name[:-len(".denied")]
                                for p in settings.workspaces_dir.glob("w*.denied")}:
        del offsets[gone]
    return sent


def _owner_and_tags(settings: Settings, ws_id: str) -> tuple[str, dict[str, str]]:
    """The owner a workspace's refusals are locked for, and its tags ("": none, or its
    record is gone, or it is a throwaway one)."""
    try:
        record = engine.load(ws_id, settings)
    except (OSError, ValueError, engine.WorkspaceError):
        return "", {}
    return ("", {}) if record.throwaway else (record.owner, dict(record.tags))


class DeniedPublisher:
    """Publishes refusals every DENIED_INTERVAL_S (the supervisor's loop ticks it)."""

    def __init__(self, settings: Settings, client: redis.Redis, keys: Sequence[str]) -> None:
        self.settings, self.client, self.keys = settings, client, keys
        self.offsets: dict[str, int] = {}
        self.next_at = 0.0

    def tick(self) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + DENIED_INTERVAL_S
        try:
            publish_denied(self.settings, self.client, self.keys, self.offsets)
        except (redis.RedisError, OSError):
            log.warning("could not publish the workspaces' refusals", exc_info=True)


#: How often a host publishes its workspaces' network refusals.
DENIED_INTERVAL_S = 1.0


def list_workspaces(rt: Runtime, request: WorkspacesRequest,
                    admin: bool = False) -> WorkspaceList:
    """The host's workspaces of the asker (every owner's for an admin who asks)."""
    if request.all_owners and not admin:
        raise ToolError("unauthorized", "listing every owner's workspaces needs the admin key")
    views = [
        engine.view(record, rt.settings) for record in engine.local_records(rt.settings)
        if not record.throwaway and (request.all_owners or record.owner == request.owner)
    ]
    return WorkspaceList(workspaces=tuple(sorted(views, key=lambda v: v.created_at)))


def read_file(rt: Runtime, request: FileReadRequest, admin: bool = False) -> FileChunk:
    """A slice of a regular file of the workspace, read in it as its calls would, within
    the host's file deadline (on a thread of its owner's lane: `bashfleet.worker.fleet.lanes`)."""
    record = owned(rt, request.workspace, request.owner, admin)
    engine.touch(record, rt.settings)
    data, size = files.read_file(record, rt.settings, request.path, offset=request.offset,
                                 limit=request.limit,
                                 timeout=lanes.time_left(rt.settings.file_op_timeout_s))
    return FileChunk(path=files.in_view(record, request.path), offset=request.offset,
                     data_b64=base64.b64encode(data).decode("ascii"), size=size,
                     eof=request.offset + len(data) >= size)


def write_file(rt: Runtime, request: FileWriteRequest, admin: bool = False) -> FileWritten:
    """Write bytes to a regular file of the workspace, in it as its calls would, within
    the host's file deadline (on a thread of its owner's lane)."""
    record = owned(rt, request.workspace, request.owner, admin)
    engine.touch(record, rt.settings)
    try:
        data = base64.b64decode(request.data_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError("invalid", f"data_b64 is not base64: {exc}") from None
    size = files.write_file(record, rt.settings, request.path, data, append=request.append,
                            mode=request.mode, make_parents=request.make_parents,
                            timeout=lanes.time_left(rt.settings.file_op_timeout_s))
    return FileWritten(path=files.in_view(record, request.path), size=size)


def reap(settings: Settings, client: redis.Redis) -> int:
    """Reap this host's expired or dead workspaces and drop them from Redis; how many."""
    reaped = engine.reap(settings)
    for record in reaped:
        try:
            unpublish(client, record)
        except redis.RedisError as exc:
            log.warning("workspace %s reaped; Redis not told: %s", record.id, exc)
    _refresh_quota(settings, client)
    from bashfleet.worker.fleet import snapshot_calls  # noqa: PLC0415 - it builds on this module

    try:
        snapshot_calls.reap(settings, client)
    except (OSError, redis.RedisError) as exc:
        log.warning("could not collect snapshots: %s", exc)
    if reaped:
        log.info("reaped %d workspace(s): %s", len(reaped), ", ".join(r.id for r in reaped))
    return len(reaped)


def _refresh_quota(settings: Settings, client: redis.Redis) -> None:
    """Keep the places of this host's live workspaces in their owners' quotas (those of
    a host that died expire after QUOTA_TTL_S)."""
    by_owner: dict[str, list[str]] = {}
    for record in engine.local_records(settings):
        if not record.throwaway:
            by_owner.setdefault(record.owner, []).append(record.id)
    for owner, ids in by_owner.items():
        registry.quota_refresh(client, QUOTA_KIND, owner, ids)


#: Seconds between two reaps of a host's workspaces (a lease ends within a minute; a
#: workspace's place in its owner's quota is renewed well within QUOTA_TTL_S).
REAP_INTERVAL_S = 15.0


class Reaper:
    """Reaps the host's workspaces every REAP_INTERVAL_S, in a thread of its own (a
    deletion waits for a keeper and removes trees: never the supervisor's loop)."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self.next_at = time.monotonic()
        self.thread: threading.Thread | None = None

    def tick(self) -> None:
        """Start a reap when one is due and none runs."""
        if time.monotonic() < self.next_at or (self.thread and self.thread.is_alive()):
            return
        self.next_at = time.monotonic() + REAP_INTERVAL_S
        self.thread = threading.Thread(target=self._reap, name="bashfleet-reaper", daemon=True)
        self.thread.start()

    def _reap(self) -> None:
        try:
            reap(self.settings, self.client)
        except Exception:  # the reaper must live on: log and retry next time
            log.exception("could not reap workspaces")
