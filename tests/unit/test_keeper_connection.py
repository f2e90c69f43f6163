"""The worker's side of a keeper's connection, against a keeper played on a socketpair:
a throwaway call's status, then the keeper's word on the workspace (`K`); a call that
ends as it is made a job."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator

import pytest

from bashfleet.worker.engine.isolate import proto
from bashfleet.worker.engine.isolate.launcher import KeeperConnection
from bashfleet.worker.engine.workspaces import keeper_calls


@pytest.fixture(name="pair")
def _pair_fixture() -> Iterator[tuple[KeeperConnection, socket.socket]]:
    ours, keeper = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn = KeeperConnection(ours)
    try:
        yield conn, keeper
    finally:
        conn.close()
        keeper.close()


def _state(conn: KeeperConnection) -> tuple[bool, bool | None, bool]:
    return conn.clean_pending, conn.clean, conn.reusable


def test_a_throwaway_calls_status_comes_first_and_its_clean_word_after(
        pair: tuple[KeeperConnection, socket.socket]) -> None:
    conn, keeper = pair
    proto.send(keeper, b"S", proto.EndAnswer(status=3 << 8, capped=False, clean_follows=True))
    assert conn.wait_status(5) == 3 << 8
    assert conn.clean_pending and conn.clean is None
    proto.send(keeper, b"K", proto.CleanAnswer(clean=True))
    assert conn.read_clean(5) is True
    assert _state(conn) == (False, True, True)
    assert conn.read_clean(5) is True  # read once: asked again, the same answer


@pytest.mark.parametrize("keeper_does", ["nothing", "closes", "says unclean"])
def test_a_keeper_that_does_not_say_clean_leaves_the_workspace_unused(
        pair: tuple[KeeperConnection, socket.socket], keeper_does: str) -> None:
    conn, keeper = pair
    proto.send(keeper, b"S", proto.EndAnswer(status=0, clean_follows=True))
    assert conn.wait_status(5) == 0
    if keeper_does == "closes":
        keeper.close()
    elif keeper_does == "says unclean":
        proto.send(keeper, b"K", proto.CleanAnswer(clean=False))
    assert conn.read_clean(0.2) is False
    assert conn.reusable is (keeper_does == "says unclean")


def test_a_status_without_a_clean_word_to_follow_reads_nothing_more(
        pair: tuple[KeeperConnection, socket.socket]) -> None:
    conn, keeper = pair
    proto.send(keeper, b"S", proto.EndAnswer(status=0))
    assert conn.wait_status(5) == 0
    assert not conn.clean_pending
    assert conn.read_clean(0.2) is False  # not asked: nothing read, nothing waited for
    assert conn.reusable


def test_a_call_that_ends_as_it_is_made_a_job_keeps_its_own_status(
        pair: tuple[KeeperConnection, socket.socket]) -> None:
    """The keeper sent the call's status, then its word on the workspace, before it read
    the request to make the call a job, which it then refuses: the status read in place
    of the job's answer is the call's (not a kill), and the connection is not reused."""
    conn, keeper = pair
    proto.send(keeper, b"S", proto.EndAnswer(status=0, clean_follows=True))
    proto.send(keeper, b"K", proto.CleanAnswer(clean=True))
    proto.send(keeper, b"E", proto.ErrorAnswer(errno=3, message="it ended already"))
    assert conn.adopt(proto.AdoptRequest(status="s", cap_mb=None, timeout_s=None,
                                         kill_grace_s=1.0), []) is False
    status = conn.wait_status(5)
    assert status == 0 and status != signal.SIGKILL
    assert conn.read_clean(5) is True
    assert not conn.reusable  # the refusal is still unread on it


def test_take_clean_reads_the_word_at_the_put_away_and_gives_the_connection_back(
        pair: tuple[KeeperConnection, socket.socket]) -> None:
    conn, keeper = pair
    proto.send(keeper, b"S", proto.EndAnswer(status=0, clean_follows=True))
    conn.wait_status(5)
    keeper_calls.recycled["w-test-clean"] = conn
    proto.send(keeper, b"K", proto.CleanAnswer(clean=True))
    try:
        assert keeper_calls.take_clean("w-test-clean") is True
        assert keeper_calls.take_clean("w-test-clean") is None  # taken once
        assert conn in keeper_calls.connections.idle["w-test-clean"]
    finally:
        keeper_calls.connections.idle.pop("w-test-clean", None)
