"""A consumer process of a worker: one Celery worker (threads pool) on one role's queues.

The host supervisor (`bashfleet.worker.fleet.supervisor`) starts two, in its process group:
`exec` on the command queues (`--concurrency` slots) and `ctl` on the control queue,
so control calls never wait for a slot:

    python -m bashfleet.worker.fleet.consumer exec|ctl --instance TOKEN

Settings come from the BASHFLEET_* variables the supervisor sets. A consumer whose
supervisor dies ends itself, and the calls it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence

import redis
from celery.signals import worker_ready, worker_shutting_down

from bashfleet.worker.engine import running, workspaces
from bashfleet.worker.fleet import flower, registry, tasks
from bashfleet.worker.fleet.app import app, setup_consumer_logging
from bashfleet.worker.fleet.connect import redis_client
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.fleet.nonces import HOST_FILE, NonceMemory
from bashfleet.worker.settings import get_settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.names import ROLES, CallState, Role

log = logging.getLogger("bashfleet.worker")

EXIT_OK = 0
EXIT_ERROR = 1
#: Threads of the control consumer: they act only on the instant control requests
#: (`tasks.INSTANT`: check, read_output...); the others they hand to their owner's lane
#: (`bashfleet.worker.fleet.lanes`).
CTL_CONCURRENCY = 4


def run_consumer(role: Role, instance: str) -> int:
    """A consumer process: one Celery worker (threads pool) on this role's queues."""
    settings = get_settings()
    host = settings.host
    celery_options = setup_consumer_logging(settings.log_format, host, role)
    runtime = Runtime(
        settings=settings, redis=redis_client(settings.redis_url_value() or ""),
        # One memory for the host: both consumers, across their restarts.
        instance=instance, nonces=NonceMemory(settings.state_dir / HOST_FILE),
    )
    tasks.set_runtime(runtime)
    _drop_plain_settings_from_env()
    if role == "exec":
        workspaces.warm(settings)  # the launcher starts now, not at the first call
    _watch_parent(role, runtime)
    # No log line per task ("received", "succeeded: <result>"): formatting and writing
    # them cost the exec consumer CPU on every call, and would copy every command's
    # output into the worker's log. Calls are seen in Flower and their call records;
    # failures are still logged (WARNING and up). bashfleet's own two short lines per
    # call (bashfleet.worker.fleet.tasks: start and end, ids and outcome) carry no command and no
    # output.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # No record looks up the file and line it was logged from (a walk up the caller's
    # frames, a third of a log line's cost): no format of ours shows them. The logging
    # HOWTO's own advice for a process that logs on every request.
    logging._srcfile = None

    keys = settings.sealing_keys()

    def ready(**_: object) -> None:
        registry.set_ready(runtime.redis, keys, host, instance, {role: os.getpid()})

    def shutting_down(**_: object) -> None:
        with contextlib.suppress(redis.RedisError):
            registry.set_ready(runtime.redis, keys, host, instance, {role: ""})

    worker_ready.connect(ready, weak=False)
    worker_shutting_down.connect(shutting_down, weak=False)
    if role == "exec":
        queues, slots = names.exec_queues(host, settings.labels), settings.concurrency
    else:
        queues, slots = [names.ctl_queue(host)], CTL_CONCURRENCY
    app.worker_main(
        [
            *celery_options, "worker", "--hostname", flower.worker_name(role, host),
            "--queues", ",".join(queues),
            "--pool", "threads", "--concurrency", str(slots), "--without-gossip",
            "--without-mingle", "--task-events", "--loglevel", "INFO",
        ]
    )
    return EXIT_OK


def _drop_plain_settings_from_env() -> None:
    """Remove the non-secret BASHFLEET_* variables from this process's environment.

    The engine scrubs every BASHFLEET_* variable from a command's environment and
    redacts the values it scrubbed wherever they show up in output, so a host id or
    a state directory left here would turn into [REDACTED] in ordinary output. The
    settings were read already (the secrets came on a pipe, never in this environment).
    """
    for name in list(os.environ):
        if name.startswith("BASHFLEET_"):
            del os.environ[name]


def _watch_parent(role: Role, runtime: Runtime) -> None:
    """End this consumer (and the calls it runs) if its supervisor dies."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)  # polling: no portable notification of a parent's death
        if role == "exec":
            _stop_own_calls(runtime)
        os._exit(EXIT_ERROR)

    threading.Thread(target=watch, name="bashfleet-parent-watch", daemon=True).start()


def _stop_own_calls(runtime: Runtime, timeout: float = 5.0) -> None:
    """Kill the calls this consumer runs; give their tasks a moment to answer."""
    mine = [e for e in running.all_calls(runtime.settings) if e.worker_pid == os.getpid()]
    for entry in mine:
        with contextlib.suppress(redis.RedisError):
            registry.mark_call(
                runtime.redis, entry.call_id, CallState.STOPPING, only_from=(CallState.RUNNING,)
            )
        running.kill(entry, running.ORPHAN_GRACE_S)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        running.load(runtime.settings, e.call_id) for e in mine
    ):
        time.sleep(0.05)  # each task removes its file once it has answered


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m bashfleet.worker.fleet.consumer`."""
    parser = argparse.ArgumentParser(
        prog="python -m bashfleet.worker.fleet.consumer",
        description="A consumer process of a worker (started by its host supervisor).",
    )
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--instance", default="", help="the host supervisor's lock token")
    args = parser.parse_args(argv)
    return run_consumer(args.role, args.instance)


if __name__ == "__main__":
    sys.exit(cli())
