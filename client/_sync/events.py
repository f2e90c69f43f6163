# Generated from client/_async/events.py by scripts/unasync.py:
# edit that file and run the script.
"""The job-event listener: what `events` and `wait` read from.

It subscribes to the events channel, reads the stream after the last event it
delivered (what it missed), then takes what the channel brings; what it delivers is
decided by the core's `EventCursor` (each event once, in order, across a Redis restart
or a fleet replaced by another: `bashfleet.client._core.events`), and only events whose seal
verifies with the keys of the fleet heard are delivered.

While Redis cannot be reached it keeps trying (RETRY_DELAYS_S), says so once in the log
(a warning: the CLI prints it on stderr) and asks its source again at each attempt, so a
local fleet brought down and up again is found at its new address, with its keys.

Written for asyncio; `client/_sync/events.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING

from bashfleet.client._core.constants import CATCH_UP_BATCH, IDLE_TICK_S, RETRY_DELAYS_S, backoff
from bashfleet.client._core.events import EventCursor
from bashfleet.client._sync import records
from bashfleet.client._sync.concurrency import close_pubsub, open_pubsub, sleep
from bashfleet.client.errors import FleetUnavailable
from bashfleet.worker.fleet.connect import connection_errors
from bashfleet.worker.wire import names
from bashfleet.worker.wire.events import JobEvent

if TYPE_CHECKING:
    from bashfleet.worker.fleet.connect import Redis

log = logging.getLogger("bashfleet.events")

#: The Redis to listen to now, its URL as messages show it, and the keys that verify
#: its fleet's events (asked again after every failed attempt: a local fleet brought
#: down and up again has another address and other keys).
Source = Callable[[], tuple["Redis", str, Mapping[str, str]]]



def _catch_up(client: Redis, cursor: EventCursor) -> deque[JobEvent]:
    """What the listener missed: the events after its cursor, read in batches."""
    found: deque[JobEvent] = deque()
    while True:
        entries = records.events_after(client, cursor.catch_up_start())
        found.extend(cursor.take_entries(entries))
        if len(entries) < CATCH_UP_BATCH:
            return found


def follow(
    source: Source, cursor: EventCursor, tick_s: float = IDLE_TICK_S
) -> Generator[JobEvent | None, None, None]:
    """Job events after `cursor`, as they happen, forever; None at each idle tick (`tick_s`
    without an event) and at each failed attempt while Redis is away."""
    attempt = 0
    away: str | None = None  # the URL found unreachable, while it is
    while True:
        where = "Redis"
        pubsub = None
        try:
            client, where, keys = source()
            pubsub = open_pubsub(client)
            pubsub.subscribe(names.EVENTS_CHANNEL)
            if cursor.connected(records.server_instance(client), time.time(), keys):
                log.info("job events: %s is another Redis instance now", where)
            backlog = _catch_up(client, cursor)
            while backlog:
                yield backlog.popleft()
            if away is not None:
                log.warning("job events: listening again (%s)", where)
                away = None
            attempt = 0
            while True:
                message = pubsub.get_message(timeout=tick_s)
                cursor.heard_from_redis(time.time())
                if message is None:
                    yield None
                elif (event := cursor.take_message(message)) is not None:
                    yield event
        except connection_errors(OSError, FleetUnavailable) as exc:
            if away is None:
                log.warning("job events: %s is unreachable (%s); still trying", where, exc)
                away = where
            yield None
            sleep(backoff(RETRY_DELAYS_S, attempt))
            attempt += 1
        finally:
            if pubsub is not None:
                close_pubsub(pubsub)
