"""The few primitives the client's I/O layer is written with, for asyncio.

`client/_async/` is written once, for asyncio; `scripts/unasync.py` turns it into the
blocking client (`client/_sync/`) by dropping `async`/`await` and the `Async` prefix of
names. What cannot be spelled the same way in both lives here, written by hand twice
(this module and `client/_sync/concurrency.py`, as httpcore's `_synchronization.py`):
events, a one-shot value, a semaphore, background work, the event-loop guard, and the
three Redis calls whose typing differs between redis-py's two clients.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from bashfleet.worker.fleet.connect import Script

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

    from bashfleet.worker.fleet.connect import AsyncRedis

T = TypeVar("T")

#: What a waiting caller's cancellation raises (the blocking client has none: a thread
#: cannot be cancelled from outside; `Fleet.cancel` from another thread is the way).
CANCELLATION_EXCEPTIONS: tuple[type[BaseException], ...] = (asyncio.CancelledError,)


async def sleep(seconds: float) -> None:
    """Pause this task."""
    await asyncio.sleep(seconds)


class AsyncEvent:
    """A flag a task can wait for, with a timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        """Raise the flag (wakes every waiter)."""
        self._event.set()

    def is_set(self) -> bool:
        """True once raised."""
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until raised or `timeout` passed; True when raised."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


class AsyncSlot(Generic[T]):
    """One value, set once (the first `set` wins), waited for by whoever needs it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._value: T | None = None

    def set(self, value: T) -> bool:
        """Fill the slot; False when it was filled already (the value is dropped)."""
        if self._event.is_set():
            return False
        self._value = value
        self._event.set()
        return True

    def done(self) -> bool:
        """True once filled."""
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> T | None:
        """The value, once set; None if `timeout` passed first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._value


class AsyncSemaphore:
    """At most `count` holders at once (`async with`)."""

    def __init__(self, count: int) -> None:
        self._semaphore = asyncio.Semaphore(count)

    async def __aenter__(self) -> None:
        await self._semaphore.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._semaphore.release()


class AsyncTasks:
    """Work running beside the callers (tasks here, threads in the blocking client): the
    reply listener, the watch, the cancels of calls whose callers gave up."""

    def __init__(self) -> None:
        self._named: dict[str, asyncio.Task[None]] = {}
        self._spawned: set[asyncio.Task[None]] = set()

    def start_once(self, name: str, function: Callable[[], Awaitable[None]]) -> None:
        """Run `function` in the background unless the one named `name` still runs."""
        running = self._named.get(name)
        if running is None or running.done():
            self._named[name] = asyncio.create_task(_run(function), name=name)

    def retire(self, name: str, idle: Callable[[], bool]) -> bool:
        """For the named work itself, when it may end: True (and it is forgotten, so the
        next `start_once` starts it anew) when `idle()` holds, which it then returns on."""
        if not idle():
            return False
        self._named.pop(name, None)
        return True

    def spawn(self, name: str, function: Callable[[], Awaitable[None]]) -> None:
        """Run `function` in the background; `join` waits for it."""
        task = asyncio.create_task(_run(function), name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def finish(self, name: str, function: Callable[[], Awaitable[None]]) -> None:
        """Run `function` as spawned work and wait for it. A cancellation of the waiting
        task stops the wait, never the work (`join` still waits for it)."""
        task = asyncio.create_task(_run(function), name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)

    async def join(self) -> None:
        """Wait for the spawned work (not the named), that spawned meanwhile included."""
        while self._spawned:
            await asyncio.gather(*self._spawned, return_exceptions=True)

    async def stop(self) -> None:
        """End the named work now (it also ends by itself once its client closes)."""
        for task in self._named.values():
            task.cancel()
        for task in self._named.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _run(function: Callable[[], Awaitable[None]]) -> None:
    await function()


class AsyncLoopGuard:
    """An asyncio client's connections belong to the event loop that first used them."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def check(self) -> None:
        """RuntimeError when called from another event loop than the first one."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError(
                "this AsyncFleet was first used in another event loop: its connections "
                "belong to that one; make one AsyncFleet per event loop"
            )


# ------------------------------------------------------------------ redis-py's typing


def open_pubsub(client: AsyncRedis) -> PubSub:
    """A pub/sub connection of `client`."""
    return client.pubsub()


async def close_pubsub(pubsub: PubSub) -> None:
    """Close a pub/sub connection, whatever state it is in."""
    with contextlib.suppress(Exception):
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def run_script(script: Script, client: AsyncRedis, keys: list[str],
                     args: list[object]) -> Any:
    """Run a Lua script (loaded on first use)."""
    return await script.run_async(client, keys, args)


async def watch(pipe: Any, *keys: str) -> None:
    """WATCH `keys` on a pipeline (its reads then run at once, its writes after MULTI)."""
    await pipe.watch(*keys)


def multi(pipe: Any) -> None:
    """MULTI on a watching pipeline: its next commands are queued, for `execute`."""
    pipe.multi()
