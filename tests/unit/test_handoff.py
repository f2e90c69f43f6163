"""A consumer's thread pool (`bashfleet.worker.fleet.handoff`): what the loop applies
starts at the transport's tick, after the tick's own work; what another thread
applies, or anything before the first tick, starts at once; a stopping pool leaves no
task kept. Celery's real threads pool, a stand-in loop (its `on_tick` set)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery.concurrency import get_implementation

from bashfleet.worker.fleet import handoff

WAIT_S = 10.0


class Loop:
    """What `after_ticks` uses of kombu's hub: its set of tick callbacks."""

    def __init__(self) -> None:
        self.on_tick: set[Callable[[], None]] = set()

    def tick(self) -> None:
        for callback in list(self.on_tick):
            callback()


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[handoff.TaskPool]:
    monkeypatch.setattr(handoff, "_loop_thread", None)
    monkeypatch.setattr(handoff, "_kept", type(handoff._kept)())
    made = handoff.TaskPool(limit=2)
    made.start()
    yield made
    made.stop()


def _apply(pool: handoff.TaskPool, target: Callable[..., Any],
           answers: list[Any] | None = None) -> Any:
    """Apply as Celery's consumer does: the task's return value goes to `callback`."""
    return pool.apply_async(target, args=(), kwargs={},
                            callback=(answers if answers is not None else []).append)


def _loop_with_transport_tick(log: list[str]) -> Loop:
    loop = Loop()
    loop.on_tick.add(lambda: log.append("other tick"))

    def transport_tick() -> None:
        log.append("transport tick")

    loop.on_tick.add(transport_tick)
    handoff.after_ticks(loop, [transport_tick])
    return loop


def test_what_the_loop_applies_starts_after_the_transports_tick(pool: handoff.TaskPool) -> None:
    log: list[str] = []
    loop = _loop_with_transport_tick(log)
    assert len(loop.on_tick) == 2  # the transport's tick now runs inside the hand-over's
    loop.tick()  # the first tick marks this thread as the loop's
    ran = threading.Event()

    def task() -> str:
        log.append("task")
        ran.set()
        return "answer"

    answers: list[Any] = []
    result = _apply(pool, task, answers)
    assert not ran.wait(0.2), "the task started before the loop's tick"
    assert handoff.keeps_now()
    loop.tick()
    assert ran.wait(WAIT_S)
    result.wait(WAIT_S)
    assert result.f.done()
    assert answers == ["answer"]
    # The transport's own tick (the next BRPOP) came before the task.
    assert log.index("task") > log.index("transport tick", 2)


def test_tasks_kept_start_in_the_order_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "_loop_thread", None)
    monkeypatch.setattr(handoff, "_kept", type(handoff._kept)())
    single = handoff.TaskPool(limit=1)  # one thread: tasks run in the order they came
    single.start()
    try:
        loop = _loop_with_transport_tick([])
        loop.tick()
        order: list[int] = []
        results = [_apply(single, lambda number=number: order.append(number))
                   for number in range(5)]
        assert order == []
        loop.tick()
        for result in results:
            result.wait(WAIT_S)
        assert order == list(range(5))
    finally:
        single.stop()


def test_another_threads_task_starts_at_once(pool: handoff.TaskPool) -> None:
    loop = _loop_with_transport_tick([])
    loop.tick()
    ran = threading.Event()
    applied: list[Any] = []
    other = threading.Thread(target=lambda: applied.append(_apply(pool, ran.set)))
    other.start()
    other.join(WAIT_S)
    assert ran.wait(WAIT_S), "a task another thread applied waited for the loop's tick"
    assert applied


def test_before_the_first_tick_a_task_starts_at_once(pool: handoff.TaskPool) -> None:
    _loop_with_transport_tick([])  # registered, never ticked
    ran = threading.Event()
    _apply(pool, ran.set)
    assert ran.wait(WAIT_S)


def test_a_failing_task_fails_its_result(pool: handoff.TaskPool) -> None:
    loop = _loop_with_transport_tick([])
    loop.tick()

    def task() -> None:
        raise ValueError("broken")

    result = _apply(pool, task)
    loop.tick()
    result.wait(WAIT_S)
    # Celery's apply_target lets an Exception out: the result holds it, nothing hangs.
    assert isinstance(result.f.exception(), ValueError)


def test_a_stopping_pool_leaves_nothing_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "_loop_thread", None)
    monkeypatch.setattr(handoff, "_kept", type(handoff._kept)())
    pool = handoff.TaskPool(limit=1)
    pool.start()
    loop = _loop_with_transport_tick([])
    loop.tick()
    ran = threading.Event()
    result = _apply(pool, ran.set)
    assert len(handoff._kept) == 1
    assert not ran.is_set()
    pool.stop()  # hands over, then shuts down: the task ran or was cancelled
    assert not handoff._kept
    assert result.f.done()


def test_the_consumer_runs_this_pool() -> None:
    # Celery's command line takes only its own pool names: the app's setting names it.
    assert get_implementation(handoff.POOL) is handoff.TaskPool
