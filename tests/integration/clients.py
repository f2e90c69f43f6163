"""Both fleet clients behind one blocking face, so one test suite runs against each.

`Fleet` is itself; an `AsyncFleet` is driven through `Blocking`: its event loop runs in a
thread of its own, and every coroutine method is awaited there (from any thread of the
test: a call and a `cancel` of it may overlap, as with `Fleet`). Async generators
(`events`) become blocking iterators.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, Literal, TypeVar, cast

from bashfleet.client import AsyncFleet, Fleet

T = TypeVar("T")

Kind = Literal["sync", "async"]
KINDS: tuple[Kind, ...] = ("sync", "async")


class Blocking:
    """An AsyncFleet, used through blocking calls."""

    def __init__(self, fleet: AsyncFleet) -> None:
        self.fleet = fleet
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="async-fleet",
                                        daemon=True)
        self._thread.start()

    def _await(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _iterate(self, stream: AsyncGenerator[T, None]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._await(stream.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._await(stream.aclose())

    def __getattr__(self, name: str) -> Any:
        member = getattr(self.fleet, name)
        if inspect.iscoroutinefunction(member):
            return lambda *args, **kwargs: self._await(member(*args, **kwargs))
        if inspect.isasyncgenfunction(member):
            return lambda *args, **kwargs: self._iterate(member(*args, **kwargs))
        return member

    def close(self) -> None:
        """Close the client, then stop its loop."""
        try:
            self._await(self.fleet.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> Blocking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_client(kind: Kind, url: str, **options: Any) -> Fleet:
    """A client of `kind`, typed as the blocking API they share."""
    if kind == "sync":
        return Fleet(url, **options)
    return cast(Fleet, Blocking(AsyncFleet(url, **options)))


ClientFactory = Callable[..., Fleet]
