"""The few primitives the client's I/O layer is written with, for threads.

Written by hand (not generated): the blocking twin of `client/_async/concurrency.py`,
which says why it exists. Same names without their `Async` prefix, same behaviour.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from bashfleet.worker.fleet.connect import Script

if TYPE_CHECKING:
    from redis.client import PubSub

    from bashfleet.worker.fleet.connect import Redis

T = TypeVar("T")

#: What a waiting caller's cancellation raises: nothing in the blocking client (a thread
#: cannot be cancelled from outside; `Fleet.cancel` from another thread is the way).
CANCELLATION_EXCEPTIONS: tuple[type[BaseException], ...] = ()

#: How long `Tasks.stop` waits for each named thread (they end within a listen tick).
STOP_WAIT_S = 2.0


def sleep(seconds: float) -> None:
    """Pause this thread."""
    time.sleep(seconds)


class Event:
    """A flag a thread can wait for, with a timeout."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Raise the flag (wakes every waiter)."""
        self._event.set()

    def is_set(self) -> bool:
        """True once raised."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until raised or `timeout` passed; True when raised."""
        return self._event.wait(timeout)


class Slot(Generic[T]):
    """One value, set once (the first `set` wins), waited for by whoever needs it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._value: T | None = None

    def set(self, value: T) -> bool:
        """Fill the slot; False when it was filled already (the value is dropped)."""
        with self._lock:
            if self._event.is_set():
                return False
            self._value = value
            self._event.set()
            return True

    def done(self) -> bool:
        """True once filled."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> T | None:
        """The value, once set; None if `timeout` passed first."""
        self._event.wait(timeout)
        return self._value


class Semaphore:
    """At most `count` holders at once (`with`)."""

    def __init__(self, count: int) -> None:
        self._semaphore = threading.BoundedSemaphore(count)

    def __enter__(self) -> None:
        self._semaphore.acquire()

    def __exit__(self, *exc: object) -> None:
        self._semaphore.release()


class Tasks:
    """Work running beside the callers (daemon threads here): the reply listener, the
    watch, the cancels of calls whose callers gave up. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._named: dict[str, threading.Thread] = {}
        self._spawned: set[threading.Thread] = set()

    def start_once(self, name: str, function: Callable[[], None]) -> None:
        """Run `function` in the background unless the one named `name` still runs."""
        with self._lock:
            running = self._named.get(name)
            if running is None or not running.is_alive():
                thread = threading.Thread(target=function, name=name, daemon=True)
                self._named[name] = thread
                thread.start()

    def retire(self, name: str, idle: Callable[[], bool]) -> bool:
        """For the named work itself, when it may end: True (and it is forgotten, so the
        next `start_once` starts it anew) when `idle()` holds, which it then returns on.
        Under the lock `start_once` takes: a caller that made it busy again (before its
        `start_once`) either finds it still running or starts it anew."""
        with self._lock:
            if not idle():
                return False
            self._named.pop(name, None)
            return True

    def spawn(self, name: str, function: Callable[[], None]) -> None:
        """Run `function` in the background; `join` waits for it."""
        thread = threading.Thread(target=function, name=name, daemon=True)
        with self._lock:
            self._spawned.add(thread)
        thread.start()

    def finish(self, name: str, function: Callable[[], None]) -> None:
        """Run `function` and wait for it (in this thread: a thread is never cancelled
        from outside, so nothing could stop the wait alone)."""
        del name
        function()

    def join(self) -> None:
        """Wait for the spawned work (not the named), that spawned meanwhile included."""
        while True:
            with self._lock:
                spawned = list(self._spawned)
                self._spawned.clear()
            if not spawned:
                return
            for thread in spawned:
                thread.join()

    def stop(self) -> None:
        """Wait (STOP_WAIT_S at most each) for the named work, which ends by itself once
        its client closes: a thread cannot be stopped from outside."""
        with self._lock:
            named = list(self._named.values())
        for thread in named:
            if thread is not threading.current_thread():
                thread.join(STOP_WAIT_S)


class LoopGuard:
    """Nothing to guard: a blocking client is used from any thread."""

    def check(self) -> None:
        """Always fine."""


# ------------------------------------------------------------------ redis-py's typing


def open_pubsub(client: Redis) -> PubSub:
    """A pub/sub connection of `client`."""
    return cast("PubSub", client.pubsub())  # type: ignore[no-untyped-call]


def close_pubsub(pubsub: PubSub) -> None:
    """Close a pub/sub connection, whatever state it is in."""
    with contextlib.suppress(Exception):
        pubsub.close()


def run_script(script: Script, client: Redis, keys: list[str], args: list[object]) -> Any:
    """Run a Lua script (loaded on first use)."""
    return script(client, keys, args)


def watch(pipe: Any, *keys: str) -> None:
    """WATCH `keys` on a pipeline (its reads then run at once, its writes after MULTI)."""
    pipe.watch(*keys)


def multi(pipe: Any) -> None:
    """MULTI on a watching pipeline: its next commands are queued, for `execute`."""
    pipe.multi()
