"""Job events as a client hears them, and the job filters of listings.

Workers add each job event (a job started, a job ended: `worker.wire.events.JobEvent`)
to the stream `bashfleet:events` and publish it on the channel of the same name, with
its stream id (`worker.fleet.registry.save_job`). A listener here

1. subscribes to the channel, then
2. reads the stream after the last id it saw (everything it missed while it was not
   subscribed: before it started, or while it reconnected), then
3. takes what the channel brings, skipping ids it has seen already.

So nothing is missed across a reconnect (up to the stream's EVENTS_MAXLEN), and nothing
is heard twice. `follow` (blocking) and `follow_async` (asyncio) are the two listeners;
`Fleet.events` / `Fleet.wait` and their `AsyncFleet` twins are built on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Generator, Mapping
from typing import Any, cast

import redis

from client.replies import backoff
from worker.fleet.connect import AsyncRedis, Redis
from worker.wire import names
from worker.wire.events import JobEvent, open_event
from worker.wire.models import JobView
from worker.wire.records import open_job_view

#: Longest block of a listener's read: how often an idle listener looks up (a `wait`
#: re-reads its job then; `close` ends a listener within it).
IDLE_TICK_S = 1.0
#: Backoff between two attempts to listen again while Redis is away.
RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0)
#: Events read per catch-up round trip.
CATCH_UP_BATCH = 500

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


def seq_key(seq: str) -> tuple[int, int]:
    """A stream id as a sortable pair (`1700000000000-3` -> (1700000000000, 3))."""
    millis, _, count = seq.partition("-")
    return int(millis or 0), int(count or 0)


def parse_entry(
    entry_id: str, fields: Mapping[str, str], keys: Mapping[str, str]
) -> JobEvent | None:
    """A stream entry as an event, its seal checked with `keys` (None: not one of ours,
    of a newer format, or not verified: dropped with a warning)."""
    return open_event(keys, fields.get("e", ""), entry_id)


def parse_published(data: str | bytes, keys: Mapping[str, str]) -> JobEvent | None:
    """A message of the events channel as an event (None when malformed or forged)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    parsed = names.parse_event_message(text)
    return parse_entry(parsed[0], {"e": parsed[1]}, keys) if parsed else None


def job_matches(
    view: JobView, *, tags: Mapping[str, str] | None = None, owner: str | None = None
) -> bool:
    """True when a listed job carries every tag of `tags` and, when `owner` is given,
    belongs to it (a job without an owner field matches no owner)."""
    if owner is not None and getattr(view, "owner", None) != owner:
        return False
    return all(view.tags.get(name) == value for name, value in (tags or {}).items())


class _Cursor:
    """The last event a listener delivered: what to skip, where to catch up from."""

    def __init__(self, since: str, keys: Mapping[str, str]) -> None:
        self.last = since
        self.keys = keys

    def fresh(self, event: JobEvent) -> bool:
        """True (and remembered) for an event after the last one delivered."""
        if seq_key(event.seq) <= seq_key(self.last):
            return False
        self.last = event.seq
        return True

    def take_entries(self, entries: list[Any]) -> list[JobEvent]:
        """The fresh events among a batch of stream entries (one not ours is passed)."""
        found = []
        for entry_id, fields in entries:
            event = parse_entry(entry_id, fields, self.keys)
            if event is None:
                self.last = entry_id
            elif self.fresh(event):
                found.append(event)
        return found

    def take_message(self, message: Mapping[str, Any]) -> JobEvent | None:
        """The fresh event a channel message brings (None: not an event, or one seen)."""
        if message["type"] != "message":
            return None
        event = parse_published(message["data"], self.keys)
        return event if event is not None and self.fresh(event) else None


# ---------------------------------------------------------------------------- blocking


def last_seq(client: Redis) -> str:
    """The id of the newest event kept ("0-0" when there is none)."""
    newest = cast("list[tuple[str, dict[str, str]]]", client.xrevrange(
        names.EVENTS_KEY, "+", "-", count=1
    ))
    return newest[0][0] if newest else "0-0"


def _catch_up(client: Redis, cursor: _Cursor) -> Generator[JobEvent, None, None]:
    while True:
        entries = cast("list[tuple[str, dict[str, str]]]", client.xrange(
            names.EVENTS_KEY, f"({cursor.last}", "+", count=CATCH_UP_BATCH
        ))
        yield from cursor.take_entries(entries)
        if len(entries) < CATCH_UP_BATCH:
            return


def follow(
    client: Redis, since: str | None = None, tick_s: float = IDLE_TICK_S, *,
    keys: Mapping[str, str],
) -> Generator[JobEvent | None, None, None]:
    """Job events after `since` (a stream id; "0-0": every event kept; None: from now),
    as they happen, forever; None at each idle tick (`tick_s` without an event). Events
    whose seal does not verify with `keys` are dropped (with a warning).

    Reconnects by itself while Redis is away (yielding None meanwhile) and catches up.
    """
    cursor = _Cursor(since if since is not None else last_seq(client), keys)
    attempt = 0
    while True:
        pubsub = client.pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(names.EVENTS_CHANNEL)
            yield from _catch_up(client, cursor)
            attempt = 0
            while True:
                message = pubsub.get_message(timeout=tick_s)
                if message is None:
                    yield None
                elif (event := cursor.take_message(message)) is not None:
                    yield event
        except _REDIS_ERRORS:
            yield None
            time.sleep(backoff(RETRY_DELAYS_S, attempt))
            attempt += 1
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()


# ----------------------------------------------------------------------------- asyncio


async def last_seq_async(client: AsyncRedis) -> str:
    """`last_seq` on an asyncio client."""
    newest = await client.xrevrange(names.EVENTS_KEY, "+", "-", count=1)
    return cast(str, newest[0][0]) if newest else "0-0"


async def _catch_up_async(client: AsyncRedis, cursor: _Cursor) -> list[JobEvent]:
    found: list[JobEvent] = []
    while True:
        entries: list[Any] = await client.xrange(  # type: ignore[assignment]
            names.EVENTS_KEY, f"({cursor.last}", "+", count=CATCH_UP_BATCH
        )
        found += cursor.take_entries(entries)
        if len(entries) < CATCH_UP_BATCH:
            return found


async def follow_async(
    client: AsyncRedis, since: str | None = None, *, keys: Mapping[str, str]
) -> AsyncGenerator[JobEvent | None, None]:
    """`follow` for asyncio."""
    cursor = _Cursor(since if since is not None else await last_seq_async(client), keys)
    attempt = 0
    while True:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(names.EVENTS_CHANNEL)
            for caught in await _catch_up_async(client, cursor):
                yield caught
            attempt = 0
            while True:
                message = await pubsub.get_message(timeout=IDLE_TICK_S)
                if message is None:
                    yield None
                elif (event := cursor.take_message(message)) is not None:
                    yield event
        except _REDIS_ERRORS:
            yield None
            await asyncio.sleep(backoff(RETRY_DELAYS_S, attempt))
            attempt += 1
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]


# ------------------------------------------------------------------------ job records


def job_views(
    client: Redis, job_ids: list[str], *, keys: Mapping[str, str]
) -> dict[str, JobView]:
    """The jobs Redis knows among `job_ids`, by id, in one round trip (a running job of
    a dead host shows `unknown`; one whose hash does not verify with `keys` is left
    out)."""
    if not job_ids:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hgetall(names.job_key(job_id))
        hashes = pipe.execute()
    hosts = sorted({fields.get("host", "") for fields in hashes if fields.get("host")})
    with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.exists(names.alive_key(host))
        alive = dict(zip(hosts, pipe.execute() if hosts else [], strict=True))
    return _views(job_ids, hashes, alive, keys)


def _views(job_ids: list[str], hashes: list[dict[str, str]], alive: Mapping[str, Any],
           keys: Mapping[str, str]) -> dict[str, JobView]:
    views = {}
    for job_id, fields in zip(job_ids, hashes, strict=True):
        up = bool(alive.get(fields.get("host", "")))
        view = open_job_view(keys, job_id, fields, host_alive=up)
        if view is not None:
            views[job_id] = view
    return views


async def job_views_async(
    client: AsyncRedis, job_ids: list[str], *, keys: Mapping[str, str]
) -> dict[str, JobView]:
    """`job_views` on an asyncio client."""
    if not job_ids:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hgetall(names.job_key(job_id))
        hashes = await pipe.execute()
    hosts = sorted({fields.get("host", "") for fields in hashes if fields.get("host")})
    alive: dict[str, Any] = {}
    if hosts:
        async with client.pipeline(transaction=False) as pipe:
            for host in hosts:
                pipe.exists(names.alive_key(host))
            alive = dict(zip(hosts, await pipe.execute(), strict=True))
    return _views(job_ids, hashes, alive, keys)

