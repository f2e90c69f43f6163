"""Workspaces' host ids: the operator's range, and claims every worker of the machine
sees (byte-range locks of one file, held by whoever claimed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bashfleet.worker.engine import id_slots

SLOT = id_slots.SLOT_SIZE
SUBIDS = "other:100000:65536\nbashfleet-run:1073741824:1073741824\n"
NAMES = ("bashfleet-run", "10002")


@pytest.mark.parametrize(
    ("only", "expected"),
    [
        (None, id_slots.Range(1073741824, 1073741824)),
        (f"1073741824:{SLOT}", id_slots.Range(1073741824, SLOT)),
        (f"{1073741824 + 4 * SLOT}:{2 * SLOT}", id_slots.Range(1073741824 + 4 * SLOT, 2 * SLOT)),
        (f"{2147483648 - SLOT}:{SLOT}", id_slots.Range(2147483648 - SLOT, SLOT)),
        (f"{2147483648 - SLOT + 1}:{SLOT}", None),  # past the end of the user's ids
        (f"100000:{SLOT}", None),  # another user's
        (f"1073741824:{SLOT - 1}", None),  # smaller than a workspace
        ("garbage", None),
    ],
)
def test_the_operators_range_must_lie_in_the_run_users_ids(
    only: str | None, expected: id_slots.Range | None
) -> None:
    found = id_slots.granted(SUBIDS, SUBIDS, NAMES, only)
    assert (found.uids if found else None) == expected
    if found is not None:
        assert found.gids == expected


def test_a_range_within_the_uids_but_not_the_gids_is_refused() -> None:
    gids = "bashfleet-run:1073741824:65536\n"
    assert id_slots.granted(SUBIDS, gids, NAMES, f"{1073741824 + SLOT}:{SLOT}") is None


@pytest.mark.parametrize(
    ("text", "error"),
    [("1:2:3", "start:count"), ("x:65536", "start:count"), ("0:100", "fewer ids")],
)
def test_malformed_ranges_say_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        id_slots.parse_range(text)


def _two_slots(start: int) -> id_slots.HostIds:
    return id_slots.HostIds(id_slots.Range(start, 2 * SLOT), id_slots.Range(start, 2 * SLOT))


def test_separate_lock_directories_hand_out_the_same_ids(tmp_path: Path) -> None:
    """What two containers with lock directories of their own did: each claims, each
    gets the first slot of the same range."""
    host = _two_slots(1073741824)
    a = id_slots.claim(host, lock_dir=tmp_path / "a")
    b = id_slots.claim(host, lock_dir=tmp_path / "b")
    try:
        assert (a.uid, a.gid) == (b.uid, b.gid)
    finally:
        a.close()
        b.close()


def test_one_lock_directory_never_hands_out_ids_twice(tmp_path: Path) -> None:
    host = _two_slots(1073741824)
    first = id_slots.claim(host, lock_dir=tmp_path)
    second = id_slots.claim(host, lock_dir=tmp_path)
    try:
        assert first.uid != second.uid and first.gid != second.gid
        with pytest.raises(OSError, match="in use"):
            id_slots.claim(host, lock_dir=tmp_path).close()
    finally:
        first.close()
    again = id_slots.claim(host, lock_dir=tmp_path)  # freed the moment its holder closed it
    assert again.uid == first.uid
    again.close()
    second.close()


def test_ranges_that_overlap_in_part_still_never_share_an_id(tmp_path: Path) -> None:
    """Locks are over the ids themselves, not slot numbers: a worker whose range starts
    half a slot further cannot take ids another's slot holds."""
    a = id_slots.claim(id_slots.HostIds(id_slots.Range(1073741824, SLOT),
                                        id_slots.Range(1073741824, SLOT)),
                  lock_dir=tmp_path)
    shifted = 1073741824 + SLOT // 2
    other = id_slots.HostIds(id_slots.Range(shifted, 2 * SLOT), id_slots.Range(shifted, 2 * SLOT))
    b = id_slots.claim(other, lock_dir=tmp_path)
    try:
        assert b.uid >= a.uid + SLOT
        assert id_slots.held(a.uid, a.gid, lock_dir=tmp_path)
        assert id_slots.held(b.uid, b.gid, lock_dir=tmp_path)
    finally:
        a.close()
        b.close()
    assert not id_slots.held(a.uid, a.gid, lock_dir=tmp_path)


def test_a_claim_survives_in_the_process_it_is_handed_to(tmp_path: Path) -> None:
    """The keeper holds the descriptor; the worker closing its own copy frees nothing."""
    host = _two_slots(1073741824)
    slot = id_slots.claim(host, lock_dir=tmp_path)
    kept = os.dup(slot.fd)
    slot.close()
    try:
        assert id_slots.held(slot.uid, slot.gid, lock_dir=tmp_path)
    finally:
        os.close(kept)
    assert not id_slots.held(slot.uid, slot.gid, lock_dir=tmp_path)


MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
23 22 0:22 / /run rw,nosuid - tmpfs tmpfs rw
24 23 0:23 /bashfleet/ids /run/bashfleet/ids rw - tmpfs tmpfs rw
25 22 8:1 /var/lib/docker/volumes/ids/_data /srv/ids rw - ext4 /dev/sda1 rw
26 22 0:24 / /srv/own\\040dir rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(
    ("path", "bound"),
    [
        ("/run/bashfleet/ids", True),  # the host's directory bound in
        ("/srv/ids", True),  # a named volume
        ("/srv/ids/deeper", True),
        ("/run/other", False),  # the container's own tmpfs
        ("/var/lib/ids", False),  # its root overlay
        ("/srv/own dir", False),
    ],
)
def test_a_containers_lock_directory_counts_only_when_bound_from_outside(
    path: str, bound: bool
) -> None:
    assert id_slots.bound_from_outside(MOUNTINFO, path) is bound


def test_a_native_workers_lock_directory_is_the_machines(tmp_path: Path) -> None:
    if os.stat("/proc/self/ns/pid").st_ino != 0xEFFFFFFC:
        pytest.skip("this test runs in a container: its /proc/1 is not the machine's init")
    assert id_slots.lock_scope(tmp_path / "ids") is None


def test_a_slot_an_earlier_versions_keeper_holds_is_not_given_again(tmp_path: Path) -> None:
    """Workspaces outlive their worker: after an upgrade, the slots their keepers locked
    the old way (a file per slot number) stay theirs."""
    import fcntl  # noqa: PLC0415

    host = _two_slots(1073741824)
    old = os.open(tmp_path / "0", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(old, fcntl.LOCK_EX)
    try:
        unaware = id_slots.claim(host, lock_dir=tmp_path)
        assert unaware.index == 0  # without the check: given again
        unaware.close()
        slot = id_slots.claim(host, lock_dir=tmp_path, legacy=True)
        assert slot.index == 1
        slot.close()
    finally:
        os.close(old)
