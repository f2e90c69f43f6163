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


def _kept(listings: Listings) -> list[bool]:
    """For each file of `_listings`, whether its stamp was kept as it was."""
    return [stamp[fork_reuse.CTIME_AT] != fork_reuse.UNTRUSTED_CTIME
            for _, (stamp, _) in sorted(listings["work"].items())]


@pytest.mark.parametrize(("ctimes", "started", "kept"), [
    ((), 10.0, []),                                  # only the layer roots, long ago
    ((5.0, 9.7), 10.0, [True, True]),                # the newest 0.3 s before the copy
    ((5.0, 9.8), 10.0, [True, False]),               # exactly the margin: not older than it
    ((9.95, 1.0), 10.0, [False, True]),              # written just before the fork
    ((10.5,), 10.0, [False]),                        # written while the copy ran
])
def test_a_stamp_younger_than_the_margin_is_remembered_as_changed(
    ctimes: tuple[float, ...], started: float, kept: list[bool],
) -> None:
    remembered = fork_reuse.remembered(_listings(*ctimes), started, margin_s=0.2)
    assert _kept(remembered) == kept
    assert remembered["root"] == _listings()["root"]


@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=20),
       st.floats(0, 1e6, allow_nan=False))
def test_remembered_keeps_each_stamp_older_than_the_margin_and_only_those(
    ctimes: list[float], started: float,
) -> None:
    listings = _listings(*ctimes)
    remembered = fork_reuse.remembered(listings, started, 0.2)
    for name, listing in listings.items():
        assert remembered[name].keys() == listing.keys()
        for rel, (stamp, blocks) in listing.items():
            kept, kept_blocks = remembered[name][rel]
            assert kept_blocks == blocks
            trusted = stamp[fork_reuse.CTIME_AT] < (started - 0.2) * 1e9
            assert (kept == stamp) is trusted
            assert kept[:fork_reuse.CTIME_AT] == stamp[:fork_reuse.CTIME_AT]


@pytest.mark.parametrize(("age", "young"), [
    (0.0, True), (fork_reuse.REUSE_WITHIN_S - 0.01, True), (fork_reuse.REUSE_WITHIN_S, False),
    (fork_reuse.HIDDEN_GRACE_S, False), (-1.0, False),  # a clock that went back: not trusted
])
def test_a_snapshot_is_used_again_only_in_the_first_half_of_its_grace(
    age: float, young: bool,
) -> None:
    assert fork_reuse.young(1000.0, 1000.0 + age) is young


def test_the_memory_keeps_the_last_fork_of_each_and_forgets_its_oldest() -> None:
    memory = ForkMemory(size=2)
    old = LastFork("s1", 100000, _listings(1.0))
    memory.remember("w1", old, copy_started=100.0)
    assert memory.last("w1") == old
    # A copy of a stamp too young to tell a later change: kept, that entry as changed.
    memory.remember("w1", LastFork("s2", 100000, _listings(99.9)), copy_started=100.0)
    kept = memory.last("w1")
    assert kept is not None and kept.snap_id == "s2" and _kept(kept.listings) == [False]
    for ws in ("w1", "w2", "w3"):
        memory.remember(ws, LastFork(f"s-{ws}", 0, _listings(1.0)), copy_started=100.0)
    assert memory.last("w1") is None  # the least recently kept, past the size
    assert [memory.last(ws).snap_id for ws in ("w2", "w3")] == ["s-w2", "s-w3"]  # type: ignore[union-attr]
    memory.forget("w2")
    assert memory.last("w2") is None
