"""The client's side of the fleet's state in Redis: what a caller records (a call it
submits or withdraws) and what it reads (hosts, call and job
records, queue depths, stored replies).

Names and TTLs are in `worker.wire.names`; the worker's side is `worker.fleet.registry`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from worker.fleet.connect import Redis, Script, flat_fields, transaction
from worker.wire import names
from worker.wire.models import HostInfo, JobView
from worker.wire.names import CallState
from worker.wire.records import open_host_info, open_job_view

# KEYS: call, [alive]; ARGV: call TTL, fields... Refuses when the host is down (its
# lock gone) or the id taken, so the client checks and records in one round trip.
_SUBMIT = Script("""
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then return 'down' end
if redis.call('EXISTS', KEYS[1]) == 1 then return 'taken' end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 'ok'
""")

# KEYS: call, queue[, alive]; ARGV: call TTL, message, fields... Records the call as
# queued and pushes its Celery message (`worker.wire.messages`) atomically: a call is
# never recorded without its message nor sent without its record, and a replica gets
# both or neither. 'down' when the named host's lock is gone, 'taken' when the id is
# in use (nothing recorded nor pushed then).
SEND = Script("""
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 'down' end
if redis.call('EXISTS', KEYS[1]) == 1 then return 'taken' end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[2])
return 'ok'
""")

#: Most messages of a queue scanned when looking for one (a queue is rarely longer).
QUEUE_SCAN_LIMIT = 10_000

# ------------------------------------------------------------------------------ calls


def submit_call(
    client: Redis, call_id: str, queue: str, host: str | None, *, require_alive: bool = False
) -> str:
    """Record a call as queued, atomically with the checks it needs.

    Returns "ok"; "taken" when the id is already in use; "down" when `require_alive`
    and no worker holds `host` (nothing is recorded then).
    """
    fields = {
        "call_id": call_id, "state": CallState.QUEUED, "queue": queue, "host": host,
        "sent_at": time.time(),
    }
    keys = [names.call_key(call_id)]
    if require_alive:
        if host is None:
            raise ValueError("require_alive needs a host")
        keys.append(names.alive_key(host))
    return cast(str, _SUBMIT(client, keys, [names.CALL_TTL_S, *flat_fields(fields)]))


def send_keys_args(
    call_id: str, queue: str, host: str | None, message: str, *, require_alive: bool
) -> tuple[list[str], list[object]]:
    """The keys and arguments of `SEND` (both clients send with it)."""
    fields = {
        "call_id": call_id, "state": CallState.QUEUED, "queue": queue, "host": host,
        "sent_at": time.time(),
    }
    keys = [names.call_key(call_id), queue]
    if require_alive:
        if host is None:
            raise ValueError("require_alive needs a host")
        keys.append(names.alive_key(host))
    return keys, [names.CALL_TTL_S, message, *flat_fields(fields)]


def send_call(
    client: Redis, call_id: str, queue: str, host: str | None, message: str, *,
    require_alive: bool,
) -> str:
    """Record a call as queued and push its message, in one round trip: "ok"; "taken"
    (the id is in use); "down" (`require_alive` and no worker holds `host`)."""
    keys, args = send_keys_args(call_id, queue, host, message, require_alive=require_alive)
    return cast(str, SEND(client, keys, args))


def withdraw_call(
    client: Redis, call_id: str, state: CallState = CallState.ABANDONED
) -> str | None:
    """Mark a queued call `state` (cancelled / abandoned) so no worker ever starts it.

    Returns the state the call had: "queued" means it is withdrawn; anything else
    (running, done...) means it was too late. A call without a record (Redis lost it
    with its message in a failover, or a sender died before sending it) counts as
    queued: it is recorded withdrawn, so a message of it that turns up is never run.
    """
    key = names.call_key(call_id)

    def body(pipe: Any) -> str | None:
        current = pipe.hget(key, "state") or CallState.QUEUED
        pipe.multi()
        if current == CallState.QUEUED:
            pipe.hset(key, mapping={"state": state, "ended_at": str(time.time())})
            pipe.expire(key, names.CALL_TTL_S)
        return cast("str | None", current)

    return transaction(client, [key], body)


def call_record(client: Redis, call_id: str) -> dict[str, str]:
    """The call record (empty when unknown or expired)."""
    return cast("dict[str, str]", client.hgetall(names.call_key(call_id)))


def message_waiting(client: Redis, queue: str, call_id: str) -> bool:
    """True when the message of `call_id` still waits in `queue` (no consumer took it).

    Messages are JSON with the task id in their headers. A queue longer than the scan
    limit counts as still holding it: the call is simply waiting its turn.
    """
    if client.llen(queue) > QUEUE_SCAN_LIMIT:
        return True
    needle = f'"id": "{call_id}"'
    return any(needle in message for message in client.lrange(queue, 0, -1))


def queue_depths(client: Redis, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue, in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue)
        lengths = pipe.execute() if queues else []
    return {queue: int(n) for queue, n in zip(queues, lengths, strict=True)}


def stored_reply(client: Redis, task_id: str) -> str | None:
    """A task's stored answer, or None (not answered yet, or expired)."""
    return cast("str | None", client.get(names.reply_key(task_id)))


# ------------------------------------------------------------------------------ hosts


def host_alive_token(client: Redis, host: str) -> str | None:
    """Token of the live instance of `host`, or None when no worker holds it."""
    return cast("str | None", client.get(names.alive_key(host)))


def live_hosts(client: Redis) -> list[str]:
    """Host ids whose worker is alive now."""
    hosts = cast("list[str]", client.zrange(names.HOSTS_KEY, 0, -1))
    if not hosts:
        return []
    with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.exists(names.alive_key(host))
        alive = pipe.execute()
    return [host for host, flag in zip(hosts, alive, strict=True) if flag]


def host_info(client: Redis, host: str, *, keys: Mapping[str, str]) -> HostInfo | None:
    """One host's record, verified with `keys`; None when the fleet does not know it (or
    its record does not verify: left out with a warning)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(names.host_key(host))
        pipe.get(names.alive_key(host))
        pipe.scard(names.running_key(host))
        record, token, busy = pipe.execute()
    return open_host_info(keys, host, record, token, int(busy))


def list_hosts(client: Redis, *, keys: Mapping[str, str]) -> list[HostInfo]:
    """Every host seen within HOST_TTL_S, alive or not, sorted by id (those whose record
    does not verify with `keys` left out)."""
    hosts = sorted(cast("list[str]", client.zrange(names.HOSTS_KEY, 0, -1)))
    infos = (host_info(client, host, keys=keys) for host in hosts)
    return [info for info in infos if info is not None]


# ------------------------------------------------------------------------------- jobs


def job_host(client: Redis, job_id: str) -> str | None:
    """Host owning a job, or None when the fleet does not know the id."""
    return cast("str | None", client.hget(names.job_key(job_id), "host"))


def list_jobs(client: Redis, host: str, *, keys: Mapping[str, str]) -> list[JobView]:
    """The jobs Redis knows for a host, oldest first, verified with `keys` (a forged one
    is left out); expired entries are pruned."""
    ids = cast("list[str]", client.zrange(names.jobs_key(host), 0, -1))
    if not ids:
        return []
    alive = client.exists(names.alive_key(host)) > 0
    with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(names.job_key(job_id))
        hashes = pipe.execute()
    views: list[JobView] = []
    gone: list[str] = []
    for job_id, fields in zip(ids, hashes, strict=True):
        view = open_job_view(keys, job_id, fields, host_alive=alive)
        if not fields:
            gone.append(job_id)
        elif view is not None:
            views.append(view)
    if gone:
        client.zrem(names.jobs_key(host), *gone)
    return views
