"""Whose lane a slow control request counts against (`tasks.lane_owner`): the key that
signed it, never the sub-owner it names. Counted by sub-owner, one owner key took every
thread of a host by naming `team::0`, `team::1`, ... (each a lane of its own); counted
by key, its requests share one lane and another owner still gets a thread at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from bashfleet.worker.fleet import lanes
from bashfleet.worker.fleet.tasks import Accepted, lane_owner
from bashfleet.worker.wire.control import CheckRequest


@pytest.mark.parametrize(("owner", "signer", "lane"), [
    ("team", "team", "team"),                          # an owner key, as itself
    ("team::0", "team", "team"),                       # ... as a sub-owner: its key's lane
    ("team::1", "team", "team"),
    ("team::session:mcp-1", "team", "team"),
    ("team::a::b", "team", "team"),
    ("bob", None, "bob"),                              # the fleet key, naming an owner
    ("team::7", None, "team"),                         # ... or a sub-owner: its root's
    ("", None, ""),                                    # an unsigned fleet's default owner
])
def test_a_request_counts_against_the_key_that_signed_it(
    owner: str, signer: str | None, lane: str
) -> None:
    assert lane_owner(owner, signer) == lane


def test_accepted_requests_of_one_key_share_a_lane_whatever_sub_owner_they_name() -> None:
    named = [Accepted(CheckRequest(id="j1", owner=f"team::{n}"), admin=False, signer="team")
             for n in range(8)]
    assert {request.lane_owner for request in named} == {"team"}
    # What the lanes used to be keyed by: eight owners, eight lanes.
    assert len({request.request.owner for request in named}) == 8


class Gate:
    """Work that records that it started and holds its thread until opened."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.started: list[str] = []
        self.lock = threading.Lock()

    def work(self, name: str) -> lanes.Work:
        def act() -> None:
            with self.lock:
                self.started.append(name)
            assert self.opened.wait(10)

        return lanes.Work(act=act, expire=lambda: None)


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)  # polling a condition, with a deadline


def _flood(key: Callable[[str], str]) -> tuple[lanes.Lanes, Gate]:
    """A host of 8 threads, 4 per owner; one key's 8 slow requests as two sub-owners
    (as 8 `--build`s were sent), each put in the lane `key` names."""
    lane = lanes.Lanes("work", per_owner=4, host=8, queue=64)
    gate = Gate()
    for n in range(8):
        lane.submit(key(f"team::{n % 2}"), gate.work(f"team{n}"))
    return lane, gate


def test_keyed_by_sub_owner_one_key_took_every_thread_of_the_host() -> None:
    lane, gate = _flood(lambda owner: owner)  # the old key: the sub-owner itself
    try:
        _until(lambda: len(gate.started) == 8)
        lane.submit("other", gate.work("other"))
        time.sleep(0.1)  # a thread would have started it well within this
        assert "other" not in gate.started  # it waits for one of team's to end
    finally:
        gate.opened.set()
    _until(lambda: lane.busy() == {})


def test_keyed_by_signing_key_another_owner_gets_a_thread_at_once() -> None:
    lane, gate = _flood(lambda owner: lane_owner(owner, "team"))
    try:
        _until(lambda: len(gate.started) == 4)
        assert lane.busy() == {"team": (4, 4)}  # its four, the rest waiting its turn
        lane.submit("other", gate.work("other"))
        _until(lambda: "other" in gate.started)
    finally:
        gate.opened.set()
    _until(lambda: lane.busy() == {})
