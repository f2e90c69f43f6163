"""Celery's consumer, publishing its task events in batches (`worker_consumer`).

A call makes three task events (received, started, succeeded: what Flower shows).
Celery publishes the buffered events at the consumer loop's next turn, so under load
nearly every event costs a publish of its own on the loop thread: a fifth of the exec
consumer's CPU in the fleet benchmark. Here they are published at most every
EVENT_FLUSH_S (or when Celery's buffer of 24 fills): one publish for many calls.
Flower sees a call up to that much later.

The loop is still woken at once when an event is buffered: that wake-up is how the
consumer notices a slot freed by a finished call (it takes no message without a free
slot, `worker_disable_prefetch`) and asks Redis for the next one.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer
from vine import promise

#: Longest delay of a task event (Flower's view of a call).
EVENT_FLUSH_S = 0.1

#: What `worker_consumer` names to use this consumer.
CONSUMER = "bashfleet.worker.fleet.batching:Consumer"


class Consumer(CeleryConsumer):  # type: ignore[misc]  # celery is untyped
    """Celery's consumer with batched task events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events_due = False
        # One promise object each: the hub's ready set then holds at most one of each.
        self._schedule_events_promise = promise(self._schedule_event_flush)
        self._due_events_promise = promise(self._flush_due_events)

    def on_send_event_buffered(self) -> None:
        """An event was buffered (by any thread): wake the loop, flush a bit later."""
        if self.hub:
            self.hub.call_soon(self._schedule_events_promise)

    def _schedule_event_flush(self) -> None:
        # On the loop thread: its timers are not thread-safe.
        if not self._events_due:
            self._events_due = True
            self.hub.call_later(EVENT_FLUSH_S, self._due_events_promise)

    def _flush_due_events(self) -> None:
        self._events_due = False
        self._flush_events()
