"""The owners' lanes of a host's slow control requests (`bashfleet.worker.fleet.lanes`): bounded per
owner and per host, owners served in turn, a full queue refused at once, an expired
request answered unrun."""

from __future__ import annotations

import threading
import time

import pytest

from bashfleet.worker.fleet import lanes
from bashfleet.worker.wire.errors import ToolError


class Gate:
    """Work that records when it ran and holds its thread until opened."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.started: list[str] = []
        self.expired: list[str] = []
        self.lock = threading.Lock()

    def work(self, name: str, expires_at: float | None = None) -> lanes.Work:
        def act() -> None:
            with self.lock:
                self.started.append(name)
            assert self.opened.wait(10)

        def expire() -> None:
            with self.lock:
                self.expired.append(name)

        return lanes.Work(act=act, expire=expire, expires_at=expires_at)


def _until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)  # polling a condition, with a deadline


def test_an_owner_gets_its_share_and_no_more_while_another_still_gets_a_thread() -> None:
    lane = lanes.Lanes("work", per_owner=2, host=3, queue=10)
    gate = Gate()
    for n in range(5):
        lane.submit("hostile", gate.work(f"h{n}"))
    _until(lambda: len(gate.started) == 2)
    time.sleep(0.05)
    assert sorted(gate.started) == ["h0", "h1"]  # its two threads; three wait
    lane.submit("victim", gate.work("v0"))
    _until(lambda: "v0" in gate.started)  # the host's third thread, at once
    assert lane.busy() == {"hostile": (2, 3), "victim": (1, 0)}
    gate.opened.set()
    _until(lambda: len(gate.started) == 6)
    _until(lambda: lane.busy() == {})


def test_owners_take_turns_for_a_freed_thread() -> None:
    lane = lanes.Lanes("work", per_owner=4, host=1, queue=10)
    gate = Gate()
    lane.submit("a", gate.work("a0"))
    _until(lambda: gate.started == ["a0"])
    for n in range(1, 4):
        lane.submit("a", gate.work(f"a{n}"))
    lane.submit("b", gate.work("b0"))
    gate.opened.set()
    _until(lambda: len(gate.started) == 5)
    # b, new to the lanes, goes first when a thread frees: not behind all of a's queue.
    assert gate.started.index("b0") == 1, gate.started


def test_a_full_queue_is_refused_at_once() -> None:
    lane = lanes.Lanes("work", per_owner=1, host=1, queue=2)
    gate = Gate()
    for n in range(3):  # one running, two waiting
        lane.submit("a", gate.work(f"a{n}"))
    with pytest.raises(ToolError) as refused:
        lane.submit("a", gate.work("a3"))
    assert refused.value.kind == "limit" and "2 work requests waiting" in refused.value.message
    lane.submit("b", gate.work("b0"))  # another owner's queue is its own
    gate.opened.set()
    _until(lambda: len(gate.started) == 4)


def test_a_request_that_waited_past_its_expiry_is_answered_unrun() -> None:
    lane = lanes.Lanes("work", per_owner=1, host=1, queue=5)
    gate = Gate()
    lane.submit("a", gate.work("first"))
    _until(lambda: gate.started == ["first"])
    lane.submit("a", gate.work("late", expires_at=time.time() + 0.05))
    time.sleep(0.1)
    gate.opened.set()
    _until(lambda: gate.expired == ["late"])
    assert gate.started == ["first"]


def test_time_left_is_the_cap_or_what_the_caller_still_waits() -> None:
    assert lanes.time_left(20.0) == 20.0  # not in a lane: the cap
    seen: list[float] = []
    done = threading.Event()

    def act() -> None:
        seen.append(lanes.time_left(20.0))
        done.set()

    lane = lanes.Lanes("work", per_owner=1, host=1, queue=1)
    lane.submit("a", lanes.Work(act=act, expire=done.set, expires_at=time.time() + 6.0))
    assert done.wait(5)
    assert 4.0 < seen[0] <= 6.0 - lanes.ANSWER_MARGIN_S


def test_a_failing_request_frees_its_thread() -> None:
    lane = lanes.Lanes("work", per_owner=1, host=1, queue=5)
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("a bug")

    lane.submit("a", lanes.Work(act=boom, expire=lambda: None))
    lane.submit("a", lanes.Work(act=ran.set, expire=lambda: None))
    assert ran.wait(5)
