"""The least a queued call with a published answer can cost Redis, measured beside
`bench_fleet`'s two sides on the same Redis: no Celery, no record, no script.

A caller LPUSHes `<its reply channel> <command>` onto a list; one of four worker threads
BRPOPs it, runs `subprocess.run(["bash", "-c", command])` (the machine as busy as the
other sides leave it) and PUBLISHes the output on the caller's channel, to which the
caller subscribed once. Three commands a call and three socket round trips (the push,
the take, the answer): any queue on Redis that hands a call to one of several workers
and delivers its answer pushed makes these at least. What Redis' CPU per call is here is
the floor under the `Redis CPU per call` row, on this machine, in this run.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from types import TracebackType

import redis

#: The list the floor's calls go through (its own: no other side reads it).
QUEUE = "bench-floor:queue"
#: How long a worker thread's BRPOP blocks before it looks whether to stop, s.
POLL_S = 1
#: How long a caller waits for its answer before it gives up, s.
ANSWER_TIMEOUT_S = 60.0


class FloorFleet:
    """Worker threads taking the floor's calls off Redis, and callers sending them.

    A context manager: the workers start on entry and are joined on exit (each within
    one POLL_S). `call` is safe from many threads at once: each has its own connection
    and reply channel.
    """

    def __init__(self, url: str, workers: int = 4) -> None:
        self._url = url
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"floor-{n}", daemon=True)
                         for n in range(workers)]
        self._local = threading.local()

    def __enter__(self) -> FloorFleet:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        client = redis.Redis.from_url(self._url)
        try:
            while not self._stop.is_set():
                taken = client.brpop([QUEUE], timeout=POLL_S)
                if taken is None:
                    continue
                message = taken[1]
                assert isinstance(message, bytes)  # a client without decode_responses
                channel, _, command = message.partition(b" ")
                done = subprocess.run(["bash", "-c", command], capture_output=True, check=False)
                client.publish(channel, done.stdout)
        finally:
            client.close()

    def call(self, command: str) -> str:
        """Send `command`, wait for its output (TimeoutError after ANSWER_TIMEOUT_S)."""
        local = self._local
        if not hasattr(local, "client"):
            local.client = redis.Redis.from_url(self._url)
            local.channel = f"bench-floor:reply:{uuid.uuid4().hex}"
            local.listener = local.client.pubsub(ignore_subscribe_messages=True)
            local.listener.subscribe(local.channel)
        local.client.lpush(QUEUE, f"{local.channel} {command}".encode())
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            # None also for the subscription's own confirmation, which is skipped.
            message = local.listener.get_message(timeout=left)
            if message is not None and message["type"] == "message":
                return bytes(message["data"]).decode()
        raise TimeoutError(f"no answer to {command!r} in {ANSWER_TIMEOUT_S} s")
