"""When a consumer's task reaches its thread: once the consumer's loop is about to wait.

Celery's threads pool hands a task to a thread the moment the consumer's loop has read
its message (`TaskPool.on_apply`). The loop is not done then: the same turn still sends
the next BRPOP and fires the loop's timers. The woken thread needs the GIL the loop
holds, and the two take turns at every system call either makes. On this 2-CPU VM
(`bench.trace_call`), a `true` call's first step, `verify` (~20 us of work), took
0.15 ms that way, and the call ended ~0.1 ms later end to end than when the hand-off
waits for the loop.

So `TaskPool` keeps what the loop applies until the loop's last step before it polls:
the transport's tick (`bashfleet.worker.fleet.transport`), which sends the next BRPOP
and then calls `hand_over`. A task applied on any other thread, or before that tick
ran once on this thread, goes to its thread at once, as with Celery's pool; a pool
that stops hands over first, so nothing kept is ever dropped unseen.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from celery.concurrency import thread
from celery.concurrency.base import apply_target

#: What a consumer sets as its app's `worker_pool` to use this pool.
POOL = "bashfleet.worker.fleet.handoff:TaskPool"

_kept: deque[Callable[[], None]] = deque()
_loop_thread: int | None = None


def keeps_now() -> bool:
    """True on the thread whose loop hands over at its tick (tasks wait for it there)."""
    return _loop_thread is not None and threading.get_ident() == _loop_thread


def hand_over() -> None:
    """Start every task kept, in the order applied."""
    while _kept:
        try:
            start = _kept.popleft()
        except IndexError:  # another thread took the last one
            return
        start()


def after_ticks(loop: Any, ticks: Iterable[Callable[[], None]]) -> None:
    """Run `ticks` (callbacks the transport just put on `loop`'s tick) in one tick that
    then hands over: the tasks read during a turn start once the next BRPOP is sent."""
    ticks = list(ticks)
    for tick in ticks:
        loop.on_tick.discard(tick)

    def tick_then_hand_over() -> None:
        global _loop_thread  # noqa: PLW0603 - one consumer loop per process
        _loop_thread = threading.get_ident()
        for tick in ticks:
            tick()
        hand_over()

    loop.on_tick.add(tick_then_hand_over)


class TaskPool(thread.TaskPool):  # type: ignore[misc]  # celery is untyped
    """Celery's threads pool, handing what the loop applies over at its tick."""

    def on_apply(
        self, target: Any, args: Any = None, kwargs: Any = None,
        callback: Any = None, accept_callback: Any = None, **_: Any,
    ) -> Any:
        """Run `target` on a thread: now, or at the loop's tick when applied by the loop."""
        if not keeps_now():
            return super().on_apply(target, args, kwargs, callback, accept_callback)
        result: Future[Any] = Future()

        def start() -> None:
            try:
                submitted = self.executor.submit(
                    apply_target, target, args, kwargs, callback, accept_callback)
            except RuntimeError as exc:  # the executor was shut down meanwhile
                result.set_exception(exc)
                return
            submitted.add_done_callback(lambda done: _copy_outcome(done, result))

        _kept.append(start)
        return thread.ApplyResult(result)

    def on_stop(self) -> None:
        """Hand over what is kept (the executor's shutdown treats it as queued), stop."""
        hand_over()
        super().on_stop()


def _copy_outcome(done: Future[Any], into: Future[Any]) -> None:
    if done.cancelled():
        into.cancel()
    elif (error := done.exception()) is not None:
        into.set_exception(error)
    else:
        into.set_result(done.result())
