"""The Celery apps of the fleet, built from the same URLs as `bashfleet.worker.fleet.connect`'s
Redis clients: the wire settings both sides must agree on, a worker's app (at most once) and a
sender's (what the worker's supervisor publishes Flower's job events with, and what
tests compare the client's hand-built messages against).

Apart from `connect` so that a client, which builds its messages itself
(`bashfleet.worker.wire.messages`), never loads Celery or kombu.
"""

from __future__ import annotations

from typing import Literal

from celery import Celery

from bashfleet.worker.fleet.connect import CONNECT_TIMEOUT_S, sentinel_target
from bashfleet.worker.fleet.transport import SENTINEL_TRANSPORT, TRANSPORT

#: kombu's Redis transport keeps one list per priority step of a queue; bashfleet uses
#: no priorities, so one step: a queue is exactly the list of its name (what
#: a client's lost-message scan and queue depths read), and a consumer polls one list per queue.
PRIORITY_STEPS = [0]

#: Sends through the client's Celery app: retry a publish twice, quickly, then fail.
_CLIENT_PUBLISH_RETRY = {
    "max_retries": 2, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5,
}


def wire_config(url: str) -> dict[str, object]:
    """Celery settings both sides must agree on: where, how encoded, no result keys."""
    target = sentinel_target(url)
    return {
        "broker_url": target.kombu_url() if target else url,
        # kombu's (its Sentinel one for sentinel://), reusing its Redis clients.
        "broker_transport": SENTINEL_TRANSPORT if target else TRANSPORT,
        # No result backend: answers travel as replies (`bashfleet.worker.fleet.registry`).
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


def _transport_options(side: Literal["client", "worker"], url: str) -> dict[str, object]:
    options: dict[str, object] = {"priority_steps": PRIORITY_STEPS}
    target = sentinel_target(url)
    if target is not None:
        options.update(target.transport_options())
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
    """A Celery app to send with (no worker): fails fast when Redis is away. The fleet
    clients do not use it (they push `bashfleet.worker.wire.messages`' JSON themselves)."""
    app = Celery("bashfleet-client", set_as_current=False)
    app.conf.update(wire_config(url))
    app.conf.update(
        broker_connection_timeout=CONNECT_TIMEOUT_S,
        broker_connection_retry=False,
        broker_transport_options=_transport_options("client", url),
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
    app = Celery("bashfleet", include=["bashfleet.worker.fleet.tasks"])
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
        # No remote control: its broadcast messages are unsigned, so anyone who can
        # write to Redis could `celery control shutdown` every host (again at each
        # restart) or `celery inspect active` a running call's arguments. Flower reads
        # the fleet from task events and worker heartbeats instead.
        worker_enable_remote_control=False,
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker outlives a Redis restart
        broker_connection_timeout=5.0,
        broker_transport_options=_transport_options("worker", url),
    )
    return app
