"""The one place that connects to the fleet: Redis clients, the Celery apps, and the two
ways of changing Redis state atomically (a Lua script, a WATCH transaction).

Like arq's `connections.py`: every process (a worker's supervisor and consumers, a
client, the MCP server, Flower) builds its Redis client here, with the same timeouts,
and its Celery app from the same wire settings, so the two sides always agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import redis
import redis.asyncio as aioredis
from celery import Celery
from kombu.utils.url import maybe_sanitize_url

from worker.fleet.transport import TRANSPORT

Redis = redis.Redis
AsyncRedis = aioredis.Redis
T = TypeVar("T")

#: Seconds to connect to Redis before giving up (a client then says FleetUnavailable).
CONNECT_TIMEOUT_S = 2.0
#: Longest wait for one Redis reply: a heartbeat or a call blocked longer is an outage.
SOCKET_TIMEOUT_S = 10.0
#: Idle connections are checked (PING) before reuse after this long.
HEALTH_CHECK_INTERVAL_S = 30

#: kombu's Redis transport keeps one list per priority step of a queue; bashfleet uses
#: no priorities, so one step: a queue is exactly the list of its name (what
#: `message_waiting` and `queue_depths` read), and a consumer polls one list per queue.
PRIORITY_STEPS = [0]

#: Sends through the client's Celery app: retry a publish twice, quickly, then fail.
_CLIENT_PUBLISH_RETRY = {
    "max_retries": 2, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5,
}


def redis_client(url: str) -> Redis:
    """A Redis client for the registry, replies and sessions (text replies)."""
    return redis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S, health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )


def safe_url(url: str) -> str:
    """The URL with its password hidden: what messages and logs may show."""
    return str(maybe_sanitize_url(url))


def async_redis_client(url: str) -> AsyncRedis:
    """`redis_client` for asyncio (`client.aio.AsyncFleet`): the same URL forms and
    timeouts, text replies. Bound to the event loop that first uses it."""
    return aioredis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S, health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )


def wire_config(url: str) -> dict[str, object]:
    """Celery settings both sides must agree on: where, how encoded, no result keys."""
    return {
        "broker_url": url,
        "broker_transport": TRANSPORT,  # kombu's, reusing its Redis clients
        # No result backend: answers travel as replies (`worker.fleet.registry`).
        "result_backend": None,
        "task_ignore_result": True,
        # JSON only: a pickle from Redis would be code execution on every worker.
        "task_serializer": "json",
        "accept_content": ["json"],
        # No task-sent event from the client: it cost every call a publish (~0.4 ms of
        # client CPU, ~0.25 ms of latency). Flower lists a call from the worker's
        # events (received, started, succeeded); a call still waiting in its queue is
        # seen in its call record (state `queued`).
        "task_send_sent_event": False,
        "enable_utc": True,
    }


def _transport_options(side: Literal["client", "worker"]) -> dict[str, object]:
    options: dict[str, object] = {"priority_steps": PRIORITY_STEPS}
    if side == "worker":
        # No ack emulation: a message taken off its queue is gone from Redis. kombu's
        # emulation would keep a copy of each (a write when it arrives, another when
        # it is acked: two round trips per call on the consumer's loop) only to put
        # back, an hour later, the message of a worker that died between taking it
        # and starting it: a call whose caller was told long ago that its worker was
        # lost. At most once wants it gone.
        options["ack_emulation"] = False
    else:
        options["visibility_timeout"] = 3600
    return options


def client_celery(url: str) -> Celery:
    """The Celery app a client sends with: fails fast when Redis is away."""
    app = Celery("bashfleet-client", set_as_current=False)
    app.conf.update(wire_config(url))
    app.conf.update(
        broker_connection_timeout=CONNECT_TIMEOUT_S,
        broker_connection_retry=False,
        broker_transport_options=_transport_options("client"),
        redis_socket_connect_timeout=CONNECT_TIMEOUT_S,
        task_publish_retry=True,
        task_publish_retry_policy=_CLIENT_PUBLISH_RETRY,
    )
    return app


def worker_celery(url: str, consumer: str) -> Celery:
    """The Celery app of a worker's consumers (and of Flower): at most once.

    A call's message is acknowledged when it starts (early ack), a worker takes no
    message it has no free slot for, and a message of a worker that died is not
    re-delivered: a shell command is never run twice behind the caller's back.
    `consumer` names the Celery consumer class (`worker_consumer`).
    """
    app = Celery("bashfleet", include=["worker.fleet.tasks"])
    app.conf.update(wire_config(url))
    app.conf.update(
        task_acks_late=False,  # early ack: at most once
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,  # no message taken without a free slot (Redis only)
        # Task events (for Flower) are also what wakes the consumer's event loop when
        # a call ends: without a free slot it does not ask for messages, and without
        # an event it would only notice the freed slot at its 1 s poll timeout.
        worker_send_task_events=True,
        worker_consumer=consumer,
        task_track_started=False,  # the call record says when a call started
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker outlives a Redis restart
        broker_connection_timeout=5.0,
        broker_transport_options=_transport_options("worker"),
    )
    return app


class Script:
    """A Lua script run with EVALSHA (loaded on first use, and again after a restart).

    Redis runs a script atomically, so a read-check-write needs one round trip and no
    WATCH retry loop: what the hot path of every call (submit, claim, finish) uses.
    """

    def __init__(self, source: str) -> None:
        # `unpack` is a global in Redis' Lua 5.1 and `table.unpack` in later Luas
        # (fakeredis' through lupa).
        self.source = "local unpack = unpack or table.unpack\n" + source
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 - Redis' id

    def __call__(self, client: Redis, keys: list[str], args: list[object]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[arg-type]
        except redis.exceptions.NoScriptError:
            # Not loaded yet (or Redis restarted): EVAL runs it and caches it.
            return client.eval(self.source, len(keys), *keys, *args)  # type: ignore[arg-type]

    async def run_async(self, client: AsyncRedis, keys: list[str], args: list[object]) -> Any:
        """`self(...)` on an asyncio client."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[arg-type]
        except redis.exceptions.NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)  # type: ignore[arg-type]


def transaction(client: Redis, keys: list[str], body: Callable[[Any], T]) -> T:
    """Run `body(pipe)` under WATCH on `keys`, retrying when another client raced us.

    `body` reads with the pipe in immediate mode, then calls `pipe.multi()` and queues
    its writes; its return value is returned once the transaction committed.
    """
    while True:
        with client.pipeline() as pipe:
            try:
                pipe.watch(*keys)  # type: ignore[no-untyped-call]
                value = body(pipe)
                pipe.execute()
                return value
            except redis.WatchError:
                continue


def hash_fields(values: Mapping[str, object]) -> dict[Any, Any]:
    """Hash values as text; None is stored as "" (and read back as None).

    Typed `Any`: redis-py's `hset(mapping=)` takes an invariant Mapping of its own
    key and value unions, which no `dict[str, str]` is.
    """
    return {k: "" if v is None else str(v) for k, v in values.items()}


def flat_fields(values: Mapping[str, object]) -> list[object]:
    """Hash fields as the flat name, value list a script passes to HSET."""
    return [item for pair in hash_fields(values).items() for item in pair]
