"""The Celery app of the workers, and of Flower (`celery -A bashfleet.worker.fleet.app flower`).

Configured explicitly, in one place:

- JSON only (never pickle): what comes from Redis is data, not code.
- At most once (`bashfleet.worker.fleet.celery_apps.worker_celery`): a call's message is
  acknowledged when it starts (early ack), a worker takes no message it has no free
  slot for, and a message of a worker that died is not re-delivered. A shell command
  is never run twice behind the caller's back.
- Task events on, so Flower sees every call a worker takes (and the event loop
  wakes when a slot frees: see `worker_disable_prefetch`), published in batches by
  our consumer (`bashfleet.worker.fleet.batching`).

Queues are not listed here: each consumer is given its own (`bashfleet.worker.fleet.supervisor`),
and the sender declares a queue when it sends to it, so a message sent while a worker
restarts waits for it.
"""

from __future__ import annotations

import logging

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from bashfleet.worker.fleet import flower, logs
from bashfleet.worker.fleet.batching import CONSUMER
from bashfleet.worker.fleet.celery_apps import worker_celery
from bashfleet.worker.settings import get_settings

#: Used only when no URL is configured (Celery's own default).
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def make_app(url: str) -> Celery:
    """The worker-side Celery app for a Redis URL (`connect.worker_celery`)."""
    return worker_celery(url, CONSUMER)


def setup_consumer_logging(log_format: logs.LogFormat, host: str, role: str) -> list[str]:
    """Log a consumer's lines in `log_format`; the global options its `celery` needs.

    Celery sets up the handlers (stream, level, stdout redirection); we set the format:
    its own look plus call ids in text, or one JSON object a line.
    """
    # Until Celery sets up its handlers, what the start logs or warns (its
    # SecurityWarning under root, for one) is in our format too.
    logs.setup(log_format, host, role)
    # No record looks for the file and line that logged it (no format shows them): a
    # walk up the stack on each of an exec consumer's two lines a call (the logging
    # HOWTO's own advice when they are not needed).
    logging._srcfile = None

    def restyle(logger: logging.Logger, format: str = logs.TEXT_FORMAT, **_: object) -> None:
        logs.restyle(logger, log_format, host, role, format)

    after_setup_logger.connect(restyle, weak=False)
    after_setup_task_logger.connect(restyle, weak=False)
    if log_format != "json":
        return []
    import celery.apps.worker as celery_worker  # noqa: PLC0415

    # Celery prints its shutdown notices ("worker: Warm shutdown") as plain text,
    # straight to the stream, from a signal handler: say them as JSON lines instead.
    celery_worker.safe_say = logs.json_say(host, role, "celery.apps.worker")
    # No startup banner (many lines of plain text); the supervisor's start line and
    # the host record say what it would.
    return ["--quiet"]


app = make_app(get_settings().redis_url_value() or DEFAULT_URL)
# Flower serving this app is read-only: its Revoke/Terminate would stop nothing.
flower.read_only_by_default()
