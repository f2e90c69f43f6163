"""The Celery app of the workers, and of Flower (`celery -A worker.app flower`).

Configured explicitly, in one place:

- JSON only (never pickle): what comes from Redis is data, not code.
- At most once: a call's message is acknowledged when it starts (early ack), a worker
  takes no message it has no free slot for, and a message of a worker that died is
  not re-delivered. A shell command is never run twice behind the caller's back.
- Task events on, so Flower sees every call a worker takes (and the event loop
  wakes when a slot frees: see `worker_disable_prefetch`).

Queues are not listed here: each consumer is given its own (`worker.serve`), and the
sender declares a queue when it sends to it, so a message sent while a worker
restarts waits for it.
"""

from __future__ import annotations

from celery import Celery

from worker import registry
from worker.settings import get_settings

#: Used only when no URL is configured (Celery's own default).
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def make_app(url: str) -> Celery:
    """The worker-side Celery app for a Redis URL."""
    app = Celery("bashfleet", include=["worker.tasks"])
    app.conf.update(registry.celery_wire_config(url))
    app.conf.update(
        task_acks_late=False,  # early ack: at most once
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,  # no message taken without a free slot (Redis only)
        # Task events (for Flower) are also what wakes the consumer's event loop when
        # a call ends: without a free slot it does not ask for messages, and without
        # an event it would only notice the freed slot at its 1 s poll timeout.
        worker_send_task_events=True,
        task_track_started=False,  # the call record says when a call started
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker outlives a Redis restart
        broker_connection_timeout=5.0,
        # No ack emulation: a message taken off its queue is gone from Redis. kombu's
        # emulation would keep a copy of each (a write when it arrives, another when
        # it is acked: two round trips per call on the consumer's loop) only to put
        # back, an hour later, the message of a worker that died between taking it
        # and starting it: a call whose caller was told long ago that its worker was
        # lost. At most once wants it gone.
        broker_transport_options={"ack_emulation": False},
    )
    return app


app = make_app(get_settings().redis_url_value() or DEFAULT_URL)
