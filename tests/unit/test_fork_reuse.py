"""fork_reuse: when a fork's snapshot may stand for the next fork's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.snapshots import fork_reuse
from bashfleet.worker.engine.snapshots.fork_reuse import ForkMemory, LastFork, Listings


def _stamp(ctime_s: float) -> tuple[tuple[int, ...], int]:
    return (0o100644, 7, 0, 0, 3, int(ctime_s * 1e9), int(ctime_s * 1e9)), 8


def _listings(*ctimes: float) -> Listings:
    return {"root": {"": _stamp(1.0)}, "work": {f"f{i}": _stamp(c) for i, c in enumerate(ctimes)}}


@pytest.mark.parametrize(("ctimes", "started", "trusted"), [
    ((), 10.0, True),                 # only the layer roots, long ago
    ((5.0, 9.7), 10.0, True),         # the newest 0.3 s before the copy
    ((5.0, 9.8), 10.0, False),        # exactly the margin: not older than it
    ((9.95,), 10.0, False),           # written just before the fork
    ((10.5,), 10.0, False),           # written while the copy ran
])
def test_trusted_only_when_every_ctime_is_older_than_the_margin(
    ctimes: tuple[float, ...], started: float, trusted: bool,
) -> None:
    assert fork_reuse.trusted(_listings(*ctimes), started, margin_s=0.2) is trusted


@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=20),
       st.floats(0, 1e6, allow_nan=False))
def test_trusted_is_every_ctime_before_start_less_the_margin(
    ctimes: list[float], started: float,
) -> None:
    listings = _listings(*ctimes)
    newest = max([1.0, *[int(c * 1e9) / 1e9 for c in ctimes]])
    assert fork_reuse.newest_ctime_s(listings) == pytest.approx(newest)
    assert fork_reuse.trusted(listings, started, 0.2) is (newest < started - 0.2)


@pytest.mark.parametrize(("age", "young"), [
    (0.0, True), (fork_reuse.REUSE_WITHIN_S - 0.01, True), (fork_reuse.REUSE_WITHIN_S, False),
    (fork_reuse.HIDDEN_GRACE_S, False), (-1.0, False),  # a clock that went back: not trusted
])
def test_a_snapshot_is_used_again_only_in_the_first_half_of_its_grace(
    age: float, young: bool,
) -> None:
    assert fork_reuse.young(1000.0, 1000.0 + age) is young


def test_the_memory_keeps_trusted_forks_forgets_the_rest_and_its_oldest() -> None:
    memory = ForkMemory(size=2)
    old = LastFork("s1", 100000, _listings(1.0))
    memory.remember("w1", old, copy_started=100.0)
    assert memory.last("w1") == old
    # A copy of stamps too young to tell a later change: what was kept of w1 goes too.
    memory.remember("w1", LastFork("s2", 100000, _listings(99.9)), copy_started=100.0)
    assert memory.last("w1") is None
    for ws in ("w1", "w2", "w3"):
        memory.remember(ws, LastFork(f"s-{ws}", 0, _listings(1.0)), copy_started=100.0)
    assert memory.last("w1") is None  # the least recently kept, past the size
    assert [memory.last(ws).snap_id for ws in ("w2", "w3")] == ["s-w2", "s-w3"]  # type: ignore[union-attr]
    memory.forget("w2")
    assert memory.last("w2") is None
