"""Where a client hears its answers: one Redis channel per client, one listener.

Every task a client sends names the client's channel as its `reply_to`. The worker
stores the answer under the task id and publishes it on that channel, in the same
round trip that records a call's end; the listener (a task here, a thread in the
blocking client) hands it to the slot waiting for it. Nothing is subscribed, polled or
deleted per call (Celery's result backend did all three: four round trips a call).

An answer published while the listener was (re)connecting is not lost: it is stored
(REPLY_TTL_S), and the watch reads it back (`records.stored_reply`). The watch also
delivers into a call's slot what it found wrong with the call (a dead worker...): the
first thing delivered wins.

Written for asyncio; `client/_sync/replies.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from bashfleet.client._async.concurrency import (
    AsyncEvent,
    AsyncSlot,
    AsyncTasks,
    close_pubsub,
    open_pubsub,
)
from bashfleet.client._core.constants import (
    LISTEN_TICK_S,
    RETRY_DELAYS_S,
    SUBSCRIBE_WAIT_S,
    backoff,
)
from bashfleet.client._core.sending import reply_of
from bashfleet.client.errors import BashfleetError
from bashfleet.worker.fleet.connect import redis_errors
from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import CallResult

if TYPE_CHECKING:
    from bashfleet.worker.fleet.connect import AsyncRedis

#: What a waiting call's slot gets: its answer as sent (sealed), or what the watch found
#: (an error, or the result of a call withdrawn before it started).
Answer = str | BashfleetError | CallResult

#: The listener's name among its client's background work.
LISTENER = "bashfleet-replies"



class AsyncReplies:
    """A client's reply channel and its listener."""

    def __init__(self, client: AsyncRedis, tasks: AsyncTasks) -> None:
        self._redis = client
        self._tasks = tasks
        self.channel = names.reply_channel(uuid.uuid4().hex)
        """The channel each task names as its `reply_to`."""
        self._waiting: dict[str, AsyncSlot[Answer]] = {}
        self._first_attempt = AsyncEvent()
        self._closed = AsyncEvent()
        self.listening = False
        """True while subscribed (answers arrive as they are published)."""
        self._listened = False

    async def expect(self, task_id: str) -> AsyncSlot[Answer]:
        """Register for a task's answer (before sending it): the slot it will fill."""
        slot: AsyncSlot[Answer] = AsyncSlot()
        self._waiting[task_id] = slot
        self._listened = True
        self._tasks.start_once(LISTENER, self._listen)
        if not self._first_attempt.is_set():
            # Only the first calls wait, and only until the first attempt ended either
            # way (then this returns at once): with Redis down a call then fails at once.
            await self._first_attempt.wait(SUBSCRIBE_WAIT_S)
        return slot

    def adopt(self, channel: str) -> bool:
        """Listen on `channel` (another client's, whose calls this one waits for) rather
        than on this client's own; only before it first listens. False when too late:
        the answers on it are then read back by the watch."""
        if self._listened:
            return channel == self.channel
        self.channel = channel
        return True

    def deliver(self, task_id: str, answer: Answer) -> None:
        """Hand an answer to its slot (heard, read back, or found by the watch)."""
        slot = self._waiting.get(task_id)
        if slot is not None:
            slot.set(answer)

    def answered(self, task_id: str) -> bool:
        """True once something was delivered for the task."""
        slot = self._waiting.get(task_id)
        return slot is not None and slot.done()

    def forget(self, task_id: str) -> None:
        """Stop waiting for a task's answer (it came, or the caller gave up)."""
        self._waiting.pop(task_id, None)

    def close(self) -> None:
        """Stop listening (the listener ends within LISTEN_TICK_S)."""
        self._closed.set()

    async def _listen(self) -> None:
        attempt = 0
        while not self._closed.is_set():
            try:
                await self._serve_subscription()
                attempt = 0
            except redis_errors(OSError, ValueError):
                self.listening = False
                self._first_attempt.set()
                await self._closed.wait(backoff(RETRY_DELAYS_S, attempt))
                attempt += 1
        self.listening = False

    async def _serve_subscription(self) -> None:
        pubsub = open_pubsub(self._redis)
        try:
            await pubsub.subscribe(self.channel)
            while not self._closed.is_set():
                message = await pubsub.get_message(timeout=LISTEN_TICK_S)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self.listening = True
                    self._first_attempt.set()
                elif message["type"] == "message":
                    parsed = reply_of(message["data"])
                    if parsed is not None:
                        self.deliver(*parsed)
        finally:
            await close_pubsub(pubsub)
