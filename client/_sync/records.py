# Generated from client/_async/records.py by scripts/unasync.py:
# edit that file and run the script.
"""The client's Redis I/O: every read and write a fleet client makes, one function each,
over the scripts of `bashfleet.worker.wire.lua` and the core's keys, arguments and
parsers (`bashfleet.client._core.records`). The readers of what workers publish (host
records, job hashes) take the client's record keys (`keys`): the core's parsers verify
each record with them and leave out what does not verify.

Written for asyncio; `client/_sync/records.py` is generated from it by
`scripts/unasync.py` (the blocking client, and the tests' probes, use that one).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from bashfleet.client._core import records as core
from bashfleet.client._core.constants import CATCH_UP_BATCH, QUEUE_SCAN_LIMIT
from bashfleet.client._core.routing import IdLookup
from bashfleet.client._core.sending import send_keys_args, withdraw_keys_args
from bashfleet.client._core.watch import WATCHED_FIELDS, waiting_ids
from bashfleet.client._core.workspaces import QUOTA_KIND, SNAPSHOT_QUOTA_KIND
from bashfleet.client._sync.concurrency import run_script
from bashfleet.worker.fleet.connect import Script, no_permission_errors
from bashfleet.worker.wire import lua, names
from bashfleet.worker.wire.models import HostInfo, JobView
from bashfleet.worker.wire.names import CallState

if TYPE_CHECKING:
    from bashfleet.worker.fleet.connect import Redis

SEND = Script(lua.SEND)
WITHDRAW = Script(lua.WITHDRAW)

# ------------------------------------------------------------------------------ calls


def send_call(
    client: Redis, call_id: str, queue: str, host: str | None, message: str, *,
    require_alive: bool, owner_tag: str = "", fresh_id: bool = False,
) -> str:
    """Record a call as queued and push its message, in one round trip: "ok"; "taken"
    (the id is in use; not looked up for a `fresh_id`); "down" (`require_alive` and no
    worker holds `host`)."""
    keys, args = send_keys_args(call_id, queue, host, message, require_alive=require_alive,
                                owner_tag=owner_tag, fresh_id=fresh_id)
    return cast(str, run_script(SEND, client, keys, args))


def forget_call(client: Redis, call_id: str) -> None:
    """Forget a call that ran nothing (its host refused it before it started), so that
    its id can be sent again."""
    client.delete(names.call_key(call_id), names.reply_key(call_id))


def withdraw_call(
    client: Redis, call_id: str, state: CallState = CallState.ABANDONED
) -> str | None:
    """Mark a queued call `state` (cancelled / abandoned) so no worker ever starts it.

    Returns the state the call had: "queued" means it is withdrawn; anything else
    (running, done...) means it was too late (`bashfleet.worker.wire.lua.WITHDRAW` says more).
    """
    keys, args = withdraw_keys_args(call_id, state)
    return cast("str | None", run_script(WITHDRAW, client, keys, args))


def call_record(client: Redis, call_id: str) -> dict[str, str]:
    """The call record (empty when unknown or expired)."""
    return cast("dict[str, str]", client.hgetall(names.call_key(call_id)))


def push(client: Redis, queue: str, message: str) -> None:
    """Put a task message on its queue list (what kombu's publish does)."""
    client.lpush(queue, message)


def stored_reply(client: Redis, task_id: str) -> str | None:
    """A task's stored answer, as sealed, or None (not answered yet, or expired): from
    its call's record, or from the key of its own (a control reply...), in one round
    trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hget(names.call_key(task_id), core.REPLY_FIELD)
        pipe.get(names.reply_key(task_id))
        in_record, apart = pipe.execute()
    return cast("str | None", in_record if in_record is not None else apart)


def queued_ids(
    client: Redis, queue: str, limit: int = QUEUE_SCAN_LIMIT
) -> set[str] | None:
    """Task ids of the messages waiting in `queue`; None when it holds more than `limit`
    (then every call in it counts as still waiting its turn)."""
    if client.llen(queue) > limit:
        return None
    return waiting_ids(cast("list[str]", client.lrange(queue, 0, -1)))


def watch_snapshot(
    client: Redis, call_ids: Sequence[str], hosts: Iterable[str]
) -> core.WatchSnapshot:
    """For the calls waited for, in one round trip: their stored answers (in their
    records, or apart), their records' watched fields, and the lock tokens of `hosts`."""
    host_list = sorted(set(hosts))
    with client.pipeline(transaction=False) as pipe:
        for call_id in call_ids:
            pipe.get(names.reply_key(call_id))
        for call_id in call_ids:
            pipe.hmget(names.call_key(call_id), [*WATCHED_FIELDS, core.REPLY_FIELD])
        for host in host_list:
            pipe.get(names.alive_key(host))
        answers = pipe.execute()
    return core.watch_snapshot(len(call_ids), WATCHED_FIELDS, host_list, answers)


# ------------------------------------------------------------------------------ hosts


def host_alive_token(client: Redis, host: str) -> str | None:
    """Token of the live instance of `host`, or None when no worker holds it."""
    return cast("str | None", client.get(names.alive_key(host)))


def known_hosts(client: Redis) -> list[str]:
    """Every host seen within HOST_TTL_S, sorted by id."""
    return sorted(cast("list[str]", client.zrange(names.HOSTS_KEY, 0, -1)))


def live_hosts(client: Redis) -> list[str]:
    """Host ids whose worker is alive now."""
    hosts = known_hosts(client)
    if not hosts:
        return []
    with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.exists(names.alive_key(host))
        alive = pipe.execute()
    return [host for host, flag in zip(hosts, alive, strict=True) if flag]


def list_hosts(
    client: Redis, only: Iterable[str] | None = None, *, keys: Mapping[str, str]
) -> list[HostInfo]:
    """Every host seen within HOST_TTL_S (or those of `only`), sorted by id, with their
    exec queues' depths: one round trip for all of them after the listing. Verified with
    `keys`: a host whose record does not verify is left out, with a warning."""
    hosts = known_hosts(client) if only is None else sorted(set(only))
    if not hosts:
        return []
    with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            for command, key in core.host_reads(host):
                getattr(pipe, command)(key)
        answers = pipe.execute()
    return core.host_infos(hosts, answers, keys)


def host_info(
    client: Redis, host: str, *, keys: Mapping[str, str]
) -> HostInfo | None:
    """One host's record, verified with `keys`; None when the fleet does not know it (or
    its record does not verify: left out with a warning)."""
    infos = list_hosts(client, [host], keys=keys)
    return infos[0] if infos else None


def queue_depths(client: Redis, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue, in one round trip."""
    if not queues:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue)
        lengths = pipe.execute()
    return {queue: int(n) for queue, n in zip(queues, lengths, strict=True)}


# ------------------------------------------------------------------------------- jobs


def job_host(client: Redis, job_id: str) -> str | None:
    """Host owning a job, or None when the fleet does not know the id.

    A routing hint, read unverified on purpose: the job's hash is sealed whole, so a
    Redis writer who changed any of its fields (`state ended`) would make a verified
    lookup fail, and `wait` / `check` / `kill` of a real job with it. The control call
    goes to the host named; that worker opens the record with its keys and answers
    `not_found` for a job it does not hold: a forged host can make the call fail, never
    make it report a state the worker did not seal.
    """
    return cast("str | None", client.hget(names.job_key(job_id), "host"))


def lookup_id(client: Redis, item_id: str) -> IdLookup:
    """What Redis knows of an id (a job's host, a call's record, and the host of the job
    that call started): one round trip, two when the id is a call that started a job."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hget(names.job_key(item_id), "host")
        pipe.hgetall(names.call_key(item_id))
        host, record = pipe.execute()
    found = IdLookup(job_host=host, call=record)
    if host is None and found.call_job_id is not None:
        found = IdLookup(call=record, call_job_host=job_host(client, found.call_job_id))
    return found


def list_jobs(
    client: Redis, host: str, *, keys: Mapping[str, str], space: str | None = None,
) -> list[JobView]:
    """The jobs Redis knows for a host (those of one owner only, from the index of its
    `space`, when given: `Identity.space`), oldest first, verified with `keys` (one that
    does not verify is left out); ids whose records expired are pruned from the list read
    (by a client allowed to: the clients' Redis user reads the index and leaves it to
    the workers)."""
    listing_key = names.jobs_key(host) if space is None else names.owner_jobs_key(host, space)
    ids = cast("list[str]", client.zrange(listing_key, 0, -1))
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        pipe.exists(names.alive_key(host))
        for job_id in ids:
            pipe.hgetall(names.job_key(job_id))
        alive, *hashes = pipe.execute()
    listing = core.job_listing(ids, hashes, host_alive=bool(alive), keys=keys)
    if listing.expired:
        with contextlib.suppress(*no_permission_errors()):
            client.zrem(listing_key, *listing.expired)
    return listing.views


def job_views(
    client: Redis, job_ids: Sequence[str], *, keys: Mapping[str, str]
) -> dict[str, JobView]:
    """The jobs Redis knows among `job_ids`, by id, in two round trips (a running job of
    a dead host shows `unknown`; one whose hash does not verify with `keys` is left
    out)."""
    if not job_ids:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hgetall(names.job_key(job_id))
        hashes = pipe.execute()
    hosts = core.hosts_of(hashes)
    alive: dict[str, Any] = {}
    if hosts:
        with client.pipeline(transaction=False) as pipe:
            for host in hosts:
                pipe.exists(names.alive_key(host))
            alive = dict(zip(hosts, pipe.execute(), strict=True))
    return core.job_views(job_ids, hashes, alive, keys)


def job_hash(client: Redis, job_id: str) -> dict[str, str]:
    """A job's hash as Redis holds it (empty: no such job), to be verified by the reader."""
    return cast("dict[str, str]", client.hgetall(names.job_key(job_id)))


# ----------------------------------------------------------------------------- events


def last_seq(client: Redis) -> str:
    """The id of the newest event kept ("0-0" when there is none)."""
    newest = cast("list[Any]", client.xrevrange(names.EVENTS_KEY, "+", "-", count=1))
    return str(newest[0][0]) if newest else "0-0"


def events_after(client: Redis, start: str,
                       count: int = CATCH_UP_BATCH) -> list[Any]:
    """Up to `count` stream entries from `start` (an XRANGE bound), oldest first."""
    return cast("list[Any]", client.xrange(names.EVENTS_KEY, start, "+", count=count))


def server_instance(client: Redis) -> str:
    """The Redis server's run id: another one after a restart, or on another server."""
    info = client.info("server")
    return str(info.get("run_id", ""))


def owner_workspaces(client: Redis, space: str) -> list[str]:
    """Ids of an owner's live workspaces (their places in the quota of its `space`,
    renewed by their hosts)."""
    now_ms = int(time.time() * 1000)
    found = client.zrangebyscore(names.quota_key(QUOTA_KIND, space), now_ms, "+inf")
    return [str(item) for item in found]


def all_workspace_ids(client: Redis) -> list[str]:
    """Ids of every workspace Redis holds a view of, every owner's (a SCAN of their keys:
    a listing, never on a call's path)."""
    prefix = names.workspace_key("")
    return [str(key)[len(prefix):]
            for key in client.scan_iter(match=names.workspace_key("*"), count=1000)]


def workspace_views(client: Redis, ids: Sequence[str]) -> list[str | None]:
    """The sealed views of these workspaces (None where Redis has none), one round trip."""
    if not ids:
        return []
    values = client.mget([names.workspace_key(ws_id) for ws_id in ids])
    return [None if value is None else str(value) for value in values]


def owner_snapshots(client: Redis, space: str) -> list[str]:
    """Ids of an owner's kept snapshots (their places in the quota of its `space`,
    renewed by their hosts)."""
    now_ms = int(time.time() * 1000)
    found = client.zrangebyscore(names.quota_key(SNAPSHOT_QUOTA_KIND, space), now_ms,
                                       "+inf")
    return [str(item) for item in found]


def snapshot_records(client: Redis, ids: Sequence[str]) -> list[str | None]:
    """The sealed records of these snapshots (None where Redis has none), one round trip."""
    if not ids:
        return []
    values = client.mget([names.snapshot_key(snap_id) for snap_id in ids])
    return [None if value is None else str(value) for value in values]
