"""The asyncio client's Redis I/O (`client.aio`): what `client.records` does for the
blocking client, on `redis.asyncio`, plus the one script that sends a call.

Sending a call is one round trip, the blocking client's `records.SEND`: it records the
call as queued (refusing a taken id, or a named host that is down) and pushes its
Celery message (`worker.wire.messages`) on its queue list, atomically.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from client.records import SEND, send_keys_args
from worker.fleet.connect import AsyncRedis, Script
from worker.wire import names
from worker.wire.models import HostInfo, JobView
from worker.wire.names import CallState
from worker.wire.records import open_host_info, open_job_view

# KEYS: call; ARGV: new state, end time, call TTL. Returns the state the call had; only
# a queued call is moved (the worker's claim is the other side of this race). A call
# without a record counts as queued (`records.withdraw_call` says why).
WITHDRAW = Script("""
local current = redis.call('HGET', KEYS[1], 'state') or 'queued'
if current == 'queued' then
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'ended_at', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return current
""")

#: Call record fields a waiting client watches.
WATCHED_FIELDS = ("state", "host", "instance", "note", "queue")


async def send_call(
    client: AsyncRedis, call_id: str, queue: str, host: str | None, message: str, *,
    require_alive: bool,
) -> str:
    """`records.send_call`: "ok", "taken" or "down"."""
    keys, args = send_keys_args(call_id, queue, host, message, require_alive=require_alive)
    return cast(str, await SEND.run_async(client, keys, args))


async def withdraw_call(
    client: AsyncRedis, call_id: str, state: CallState = CallState.ABANDONED
) -> str | None:
    """`records.withdraw_call`: the state the call had ("queued": withdrawn)."""
    previous = await WITHDRAW.run_async(
        client, [names.call_key(call_id)], [state, time.time(), names.CALL_TTL_S]
    )
    return cast("str | None", previous)


async def call_record(client: AsyncRedis, call_id: str) -> dict[str, str]:
    """The call record (empty when unknown or expired)."""
    return cast("dict[str, str]", await client.hgetall(names.call_key(call_id)))


async def push(client: AsyncRedis, queue: str, message: str) -> None:
    """Put a task message on its queue list (what kombu's publish does)."""
    await client.lpush(queue, message)


async def stored_reply(client: AsyncRedis, task_id: str) -> str | None:
    """A task's stored answer, or None."""
    return cast("str | None", await client.get(names.reply_key(task_id)))


async def host_alive_token(client: AsyncRedis, host: str) -> str | None:
    """Token of the live instance of `host`, or None."""
    return cast("str | None", await client.get(names.alive_key(host)))


async def watch_snapshot(
    client: AsyncRedis, call_ids: Sequence[str], hosts: Iterable[str]
) -> tuple[list[str | None], list[dict[str, str | None]], dict[str, str | None]]:
    """For waiting calls, in one round trip: their stored replies, their records' watched
    fields, and the lock tokens of `hosts`."""
    host_list = sorted(set(hosts))
    async with client.pipeline(transaction=False) as pipe:
        for call_id in call_ids:
            pipe.get(names.reply_key(call_id))
        for call_id in call_ids:
            pipe.hmget(names.call_key(call_id), list(WATCHED_FIELDS))
        for host in host_list:
            pipe.get(names.alive_key(host))
        answers = await pipe.execute()
    count = len(call_ids)
    replies = cast("list[str | None]", answers[:count])
    fields = [dict(zip(WATCHED_FIELDS, row, strict=True)) for row in answers[count:2 * count]]
    tokens = dict(zip(host_list, answers[2 * count:], strict=True))
    return replies, fields, tokens


async def queued_ids(client: AsyncRedis, queue: str, limit: int) -> set[str] | None:
    """Task ids of the messages waiting in `queue`; None when it holds more than
    `limit` (then every call in it counts as still waiting its turn)."""
    if await client.llen(queue) > limit:
        return None
    found: set[str] = set()
    messages = cast("list[str]", await client.lrange(queue, 0, -1))
    for message in messages:
        start = message.find('"id": "')
        if start >= 0:
            start += len('"id": "')
            found.add(message[start:message.find('"', start)])
    return found


async def queue_depths(client: AsyncRedis, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue, in one round trip."""
    if not queues:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue)
        lengths = await pipe.execute()
    return {queue: int(n) for queue, n in zip(queues, lengths, strict=True)}


async def live_hosts(client: AsyncRedis) -> list[str]:
    """Host ids whose worker is alive now."""
    hosts = cast("list[str]", await client.zrange(names.HOSTS_KEY, 0, -1))
    if not hosts:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.exists(names.alive_key(host))
        alive = await pipe.execute()
    return [host for host, flag in zip(hosts, alive, strict=True) if flag]


async def list_hosts(
    client: AsyncRedis, only: Iterable[str] | None = None, *, keys: Mapping[str, str]
) -> list[HostInfo]:
    """Every host seen within HOST_TTL_S (or those of `only`), sorted by id, verified with
    `keys` (a forged record is left out); one round trip for all of them after the
    listing."""
    if only is None:
        hosts = sorted(cast("list[str]", await client.zrange(names.HOSTS_KEY, 0, -1)))
    else:
        hosts = sorted(set(only))
    if not hosts:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.hgetall(names.host_key(host))
            pipe.get(names.alive_key(host))
            pipe.scard(names.running_key(host))
        answers = await pipe.execute()
    infos = []
    for index, host in enumerate(hosts):
        record, token, busy = answers[3 * index:3 * index + 3]
        info = open_host_info(keys, host, record, token, int(busy))
        if info is not None:
            infos.append(info)
    return infos


async def job_host(client: AsyncRedis, job_id: str) -> str | None:
    """Host owning a job, or None."""
    return cast("str | None", await client.hget(names.job_key(job_id), "host"))


async def job_fields(client: AsyncRedis, job_id: str) -> dict[str, str]:
    """The raw job hash (empty when unknown or expired)."""
    return cast("dict[str, str]", await client.hgetall(names.job_key(job_id)))


async def list_jobs(client: AsyncRedis, host: str, *, keys: Mapping[str, str]) -> list[JobView]:
    """The jobs Redis knows for a host, oldest first, verified with `keys` (a forged one
    is left out)."""
    ids = cast("list[str]", await client.zrange(names.jobs_key(host), 0, -1))
    if not ids:
        return []
    alive = await client.exists(names.alive_key(host)) > 0
    async with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(names.job_key(job_id))
        hashes = await pipe.execute()
    views = [open_job_view(keys, job_id, fields, host_alive=alive)
             for job_id, fields in zip(ids, hashes, strict=True)]
    return [view for view in views if view is not None]
