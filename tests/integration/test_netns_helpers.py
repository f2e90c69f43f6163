"""The test networks' own choice of a /30 (`netns_helpers.free_slash30`): pure."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .netns_helpers import free_slash30

NET = "203.0.113.0/24"


@pytest.mark.parametrize(("taken", "start", "wanted"), [
    ([], 0, "203.0.113.0/30"),
    ([], 65, "203.0.113.4/30"),  # wraps: 64 slots
    (["203.0.113.0/30"], 0, "203.0.113.4/30"),
    (["203.0.113.1/32"], 0, "203.0.113.4/30"),  # an address inside a slot takes it
    (["203.0.113.252/30"], 63, "203.0.113.0/30"),  # the last one taken: wraps
    (["10.0.0.0/8"], 5, "203.0.113.20/30"),  # another network's address is no matter
])
def test_the_first_free_slot_from_the_start_is_chosen(
        taken: list[str], start: int, wanted: str) -> None:
    networks = [ipaddress.IPv4Network(t) for t in taken]
    assert str(free_slash30(NET, networks, start)) == wanted


def test_a_subnet_all_in_use_is_said() -> None:
    with pytest.raises(AssertionError, match="every /30"):
        free_slash30(NET, [ipaddress.IPv4Network("203.0.113.0/24")], 0)


@given(st.lists(st.integers(0, 63), max_size=63), st.integers(0, 1 << 16))
def test_a_chosen_slot_overlaps_nothing_taken(used: list[int], start: int) -> None:
    taken = [ipaddress.IPv4Network(f"203.0.113.{4 * n}/30") for n in used]
    slot = free_slash30(NET, taken, start)
    assert slot.prefixlen == 30 and slot.subnet_of(ipaddress.IPv4Network(NET))
    assert not any(slot.overlaps(t) for t in taken)
