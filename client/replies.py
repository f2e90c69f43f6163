"""Where a client hears its answers: one Redis channel per client, one listening thread.

Every task a client sends names the client's channel as its `reply_to`. The worker
stores the answer under the task id and publishes it on that channel, in the same
round trip that records a call's end; the listener hands it to the thread waiting for
it. Nothing is subscribed, polled or deleted per call (Celery's result backend did all
three: four round trips a call).

An answer published while the listener was (re)connecting is not lost: it is stored
(REPLY_TTL_S), and a waiter that heard nothing reads it at its next watch (`stored`).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis

from client import records
from client.errors import Unauthorized
from worker.wire import auth, names

#: How long the first call of a client waits for its subscription before sending: an
#: answer published before it would only be read at the next watch (half a second).
SUBSCRIBE_WAIT_S = 2.0
#: Longest block of the listener's read, so that `close` ends it soon.
LISTEN_TICK_S = 0.25
#: Backoff between two subscription attempts while Redis is away.
RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0)


def backoff(delays: tuple[float, ...], attempt: int) -> float:
    """The wait before attempt `attempt` + 1 (counted from 0): the last delay repeats."""
    return delays[min(attempt, len(delays) - 1)]


@dataclass
class Waiter:
    """One task's answer, once it arrived."""

    task_id: str
    arrived: threading.Event = field(default_factory=threading.Event)
    payload: str | None = None

    def wait(self, timeout: float) -> str | None:
        """The answer, if it arrives within `timeout` seconds."""
        return self.payload if self.arrived.wait(timeout) else None


class Replies:
    """A client's reply channel and the thread listening on it. Thread-safe."""

    def __init__(self, client: redis.Redis, keys: Mapping[str, str] | None = None) -> None:
        """`keys`: the keys (by id) a worker may seal this client's answers with; none:
        an unsigned client, which takes answers as they come."""
        self._redis = client
        self._keys = dict(keys or {})
        self.channel = names.reply_channel(uuid.uuid4().hex)
        """The channel to name as each task's `reply_to`."""
        self._lock = threading.Lock()
        self._waiting: dict[str, Waiter] = {}
        self._subscribed = threading.Event()
        self._first_attempt = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def expect(self, task_id: str) -> Waiter:
        """Register for a task's answer; call before sending the task."""
        waiter = Waiter(task_id)
        with self._lock:
            self._waiting[task_id] = waiter
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._listen, name="bashfleet-replies", daemon=True
                )
                self._thread.start()
        # Only the first calls wait, and only until the first attempt ended either way
        # (then this returns at once): with Redis down a call then fails at once.
        self._first_attempt.wait(SUBSCRIBE_WAIT_S)
        return waiter

    def forget(self, waiter: Waiter) -> None:
        """Stop waiting for a task's answer (it came, or the caller gave up)."""
        with self._lock:
            if self._waiting.get(waiter.task_id) is waiter:
                del self._waiting[waiter.task_id]

    def stored(self, task_id: str) -> str | None:
        """A task's stored answer, as sealed: for one whose publish the listener missed."""
        return records.stored_reply(self._redis, task_id)

    def answer(self, waiter: Waiter, timeout: float) -> str | None:
        """The task's answer if it arrives within `timeout`, else the stored one (the
        listener may have missed its publish while reconnecting), else None; verified.

        Unauthorized when its seal does not verify: a Redis writer may have published
        it (a forged "all tests passed"); the caller gets an error, never the text.
        """
        sealed = waiter.wait(timeout)
        if sealed is None:
            sealed = self.stored(waiter.task_id)
        return None if sealed is None else open_reply(self._keys, waiter.task_id, sealed)

    @property
    def listening(self) -> bool:
        """True while subscribed (answers arrive as they are published)."""
        return self._subscribed.is_set()

    def close(self) -> None:
        """Stop listening (the thread ends within LISTEN_TICK_S)."""
        self._closed.set()

    # ------------------------------------------------------------------ listener

    def _listen(self) -> None:
        attempt = 0
        while not self._closed.is_set():
            try:
                self._serve_subscription()
                attempt = 0
            except (redis.RedisError, OSError, ValueError):
                self._subscribed.clear()
                self._first_attempt.set()
                delay = backoff(RETRY_DELAYS_S, attempt)
                attempt += 1
                self._closed.wait(delay)
        self._subscribed.clear()

    def _serve_subscription(self) -> None:
        pubsub = self._redis.pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            while not self._closed.is_set():
                message = pubsub.get_message(timeout=LISTEN_TICK_S)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self._subscribed.set()
                    self._first_attempt.set()
                elif message["type"] == "message":
                    self._deliver(message["data"])
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()

    def _deliver(self, data: str | bytes) -> None:
        parsed = reply_of(data)
        if parsed is None:
            return
        task_id, payload = parsed
        with self._lock:
            waiter = self._waiting.get(task_id)
        if waiter is not None:
            waiter.payload = payload
            waiter.arrived.set()


def reply_of(data: str | bytes) -> tuple[str, str] | None:
    """(task id, answer as sent) of a message heard on a reply channel; None when it is
    not one. What both listeners (this one and `client.aio`'s) parse with."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return names.parse_reply_message(text)


def open_reply(keys: Mapping[str, str], task_id: str, sealed: str) -> str:
    """A worker's answer to `task_id`, its seal checked with `keys`; Unauthorized when
    it does not verify (the answer is not trusted, whatever it says)."""
    try:
        return auth.unseal(keys, auth.REPLY, task_id, sealed)
    except auth.AuthError as exc:
        raise Unauthorized(
            f"the answer to {task_id} could not be verified ({exc.message}); it was not "
            "trusted: a worker with another key, or a forgery in Redis"
        ) from None
