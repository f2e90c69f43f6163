"""bashfleet.worker.engine.snapshots.snapshots.image_id: a workspace's host ids as its snapshot
keeps them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine import id_slots
from bashfleet.worker.engine.snapshots import snapshots

FIRST = 1_073_741_824 + 3 * id_slots.SLOT_SIZE


@pytest.mark.parametrize(
    ("host_id", "kept"),
    [
        (FIRST, 0),                              # the workspace's root
        (FIRST + 1000, 1000),
        (FIRST + id_slots.SLOT_SIZE - 1, id_slots.SLOT_SIZE - 1),
        (FIRST + id_slots.SLOT_SIZE, snapshots.OVERFLOW_ID),  # the next workspace's
        (FIRST - 1, snapshots.OVERFLOW_ID),
        (0, 0),                                  # host root: the overlay's whiteouts
        (999, snapshots.OVERFLOW_ID),            # the run user, or any other account
    ],
)
def test_image_id(host_id: int, kept: int) -> None:
    assert snapshots.image_id(host_id, FIRST) == kept


@given(st.integers(0, id_slots.SLOT_SIZE - 1), st.integers(1, 2**31 - id_slots.SLOT_SIZE))
def test_a_slots_ids_come_back_through_any_other_slot(inside: int, first: int) -> None:
    """Shifted to the image-like id, then shown through another workspace's map (which
    adds its first id): the same id inside, never one outside that slot."""
    kept = snapshots.image_id(first + inside, first)
    assert kept == inside
    other = FIRST
    assert other <= other + kept < other + id_slots.SLOT_SIZE


@given(st.integers(0, 2**32 - 1), st.integers(1, 2**31 - id_slots.SLOT_SIZE))
def test_every_id_lands_in_the_image_range(host_id: int, first: int) -> None:
    assert 0 <= snapshots.image_id(host_id, first) < id_slots.SLOT_SIZE
