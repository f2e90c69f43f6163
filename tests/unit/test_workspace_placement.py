"""Where a new workspace goes (`choose_host`): the owner's fewest live workspaces first,
then the least loaded host, then any of those at random; a label narrows the hosts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client._core.workspaces import choose_host, load, owned_by_host
from bashfleet.client.errors import HostUnavailable
from bashfleet.worker.wire.models import HostInfo, WorkspaceView


def info(host: str, *, alive: bool = True, slots: int = 4, busy: int = 0, queued: int = 0,
         labels: tuple[str, ...] = ()) -> HostInfo:
    return HostInfo(host=host, alive=alive, slots=slots, busy=busy, queued=queued,
                    labels=labels)


def first(hosts: Sequence[str]) -> str:
    return hosts[0]


IDLE = [info("local"), info("m1"), info("m2")]

CASES = {
    "the owner's fewest first": (IDLE, None, {"local": 2, "m1": 1, "m2": 1}, ["m1", "m2"]),
    "then the least loaded": ([info("local", busy=1), info("m1", busy=3), info("m2")], None,
                              {}, ["m2"]),
    "load is per slot": ([info("big", slots=8, busy=2), info("small", slots=2, busy=1)],
                         None, {}, ["big"]),
    "queued calls load it too": ([info("a", queued=2), info("b", busy=1)], None, {}, ["b"]),
    "fewest before load": ([info("a", busy=4), info("b")], None, {"b": 1}, ["a"]),
    "ties are all candidates": (IDLE, None, {}, ["local", "m1", "m2"]),
    "dead hosts never": ([info("a", alive=False), info("b", busy=4)], None, {}, ["b"]),
    "a label narrows": ([info("a", labels=("gpu",)), info("b"), info("c", labels=("gpu",))],
                        "gpu", {"a": 1}, ["c"]),
}


@pytest.mark.parametrize(("infos", "label", "owned", "candidates"), CASES.values(),
                         ids=CASES.keys())
def test_choose_host(infos: list[HostInfo], label: str | None, owned: dict[str, int],
                     candidates: list[str]) -> None:
    offered: list[Sequence[str]] = []

    def pick(hosts: Sequence[str]) -> str:
        offered.append(hosts)
        return hosts[-1]

    assert choose_host(infos, None, label, owned=owned, pick=pick) == candidates[-1]
    assert offered == [candidates]


def test_a_named_host_is_taken_as_it_is() -> None:
    assert choose_host([], "elsewhere", None, pick=first) == "elsewhere"


@pytest.mark.parametrize("label", [None, "gpu"])
def test_no_live_host_is_host_unavailable(label: str | None) -> None:
    with pytest.raises(HostUnavailable, match="no live host"):
        choose_host([info("a", alive=False), info("b")], None, "gpu", pick=first)
    with pytest.raises(HostUnavailable):
        choose_host([], None, label)


def test_the_tie_break_is_not_by_name() -> None:
    chosen = {choose_host(IDLE, None, None) for _ in range(200)}
    assert chosen == {"local", "m1", "m2"}


def test_twelve_placed_in_turn_spread_evenly() -> None:
    placing: dict[str, int] = {}
    for _ in range(12):
        where = choose_host(IDLE, None, None, owned=owned_by_host([], placing))
        placing[where] = placing.get(where, 0) + 1
    assert placing == {"local": 4, "m1": 4, "m2": 4}


def test_owned_counts_views_and_those_being_made() -> None:
    views = [WorkspaceView(id=f"w{n}", host=host, path="/w", isolation="process",
                           network=True, ttl_s=60, created_at=0)
             for n, host in enumerate(("a", "a", "b"))]
    assert owned_by_host(views, {"b": 1, "c": 2}) == {"a": 2, "b": 2, "c": 2}


HOST_INFOS = st.lists(st.builds(
    info, st.sampled_from(["a", "b", "c", "d", "e"]), alive=st.booleans(),
    slots=st.integers(0, 8), busy=st.integers(0, 8), queued=st.integers(0, 8),
    labels=st.sampled_from([(), ("gpu",)]),
), min_size=1, max_size=6, unique_by=lambda i: i.host)


@given(HOST_INFOS, st.dictionaries(st.sampled_from("abcde"), st.integers(0, 5)),
       st.sampled_from([None, "gpu"]))
def test_the_chosen_host_is_live_and_none_ranks_before_it(
        infos: list[HostInfo], owned: dict[str, int], label: str | None) -> None:
    eligible = [i for i in infos if i.alive and (label is None or label in i.labels)]
    if not eligible:
        with pytest.raises(HostUnavailable):
            choose_host(infos, None, label, owned=owned)
        return
    picked = choose_host(infos, None, label, owned=owned)  # once: ties are picked at random
    chosen = next(i for i in eligible if i.host == picked)
    for other in eligible:
        mine, theirs = owned.get(chosen.host, 0), owned.get(other.host, 0)
        assert mine < theirs or (mine == theirs and load(chosen) <= load(other))
