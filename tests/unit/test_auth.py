"""bashfleet.worker.wire.auth: HMAC envelopes; every refusal has its kind."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.wire.auth import (
    AuthError,
    check_mark,
    check_target,
    key_id,
    keyring,
    mark,
    verify,
)
from bashfleet.worker.wire.auth import sign as sign_for

KEY, OLD, OTHER = "k" * 32, "old-key-" * 4, "x" * 32
NOW = 1_800_000_000.0
TASK = "bashfleet.exec"
CALL: list[Any] = [{"call_id": "c1", "command": "echo hi", "env": {"A": "1"}}]
TARGET = "bashfleet.s1.exec"


def sign(key: str, task: str, args: list[Any], now: float, ttl_s: float = 300.0) -> Any:
    """A message signed for host s1's command queue."""
    return sign_for(key, task, args, now, ttl_s, target=TARGET)


def _kind(envelope: object, keys: dict[str, str] | None = None, now: float = NOW,
          task: str = TASK) -> str:
    with pytest.raises(AuthError) as caught:
        verify(envelope, task, keys if keys is not None else keyring([KEY]), now)
    return caught.value.reason


def test_a_signed_message_verifies_and_returns_its_args() -> None:
    envelope = sign(KEY, TASK, CALL, NOW)
    verified = verify(envelope, TASK, keyring([KEY]), NOW + 10)
    assert verified.args == CALL
    assert len(verified.nonce) == 32 and verified.expires > NOW


def test_nonces_differ_between_messages() -> None:
    first, second = sign(KEY, TASK, CALL, NOW), sign(KEY, TASK, CALL, NOW)
    assert first["auth"]["nonce"] != second["auth"]["nonce"]


def test_unsigned_malformed_unknown_key_expired() -> None:
    assert _kind(CALL[0]) == "unsigned"
    assert _kind({"auth": "x", "args": CALL}) == "malformed"
    assert _kind({"v": 2, "target": TARGET, "auth": {"key": 1}, "args": CALL}) == "malformed"
    assert _kind(sign(OTHER, TASK, CALL, NOW)) == "unknown_key"
    assert _kind(sign(KEY, TASK, CALL, NOW, ttl_s=1), now=NOW + 1000) == "expired"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda e: e["args"][0].update(command="rm -rf ~"),
        lambda e: e["args"][0]["env"].update(A="2"),
        lambda e: e["auth"].update(exp=e["auth"]["exp"] + 3600),
        lambda e: e["auth"].update(nonce="0" * 32),
        lambda e: e.update(task="bashfleet.kill"),
        lambda e: e.update(target="bashfleet.s2.exec"),
    ],
)
def test_any_change_breaks_the_signature(tamper: Any) -> None:
    envelope = sign(KEY, TASK, CALL, NOW)
    forged = copy.deepcopy(envelope)
    tamper(forged)
    assert _kind(forged) == "bad_signature"


def test_a_message_for_one_task_is_refused_by_another() -> None:
    assert _kind(sign(KEY, TASK, CALL, NOW), task="bashfleet.kill") == "bad_signature"


def test_rotation_accepts_old_and_new_keys_by_id() -> None:
    ring = keyring([KEY, OLD, ""])
    assert set(ring) == {key_id(KEY), key_id(OLD)}
    assert verify(sign(OLD, TASK, CALL, NOW), TASK, ring, NOW).args == CALL
    assert key_id(KEY) not in KEY  # the id does not reveal the key


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10,
))
def test_any_json_arguments_round_trip(value: Any) -> None:
    args = [value]
    assert verify(sign(KEY, TASK, args, NOW), TASK, keyring([KEY]), NOW).args == args


# ------------------ the target: a message is good only for the queue it was signed for


def test_a_message_names_the_queue_it_was_signed_for() -> None:
    verified = verify(sign(KEY, TASK, CALL, NOW), TASK, keyring([KEY]), NOW)
    assert verified.target == TARGET


def test_an_old_message_without_a_target_is_refused_clearly() -> None:
    old = sign(KEY, TASK, CALL, NOW)
    old["v"] = 1
    del old["target"]
    assert _kind(old) == "bad_version"


@pytest.mark.parametrize(
    ("target", "queue", "own", "refused"),
    [
        # s1's own message on s1's queue.
        ("bashfleet.s1.exec", "bashfleet.s1.exec", ["bashfleet.s1.exec"], False),
        # Captured for s1, pushed onto s2's queue: s2 refuses it.
        ("bashfleet.s1.exec", "bashfleet.s2.exec", ["bashfleet.s2.exec"], True),
        # Captured on s1's command queue, pushed onto its control queue.
        ("bashfleet.s1.exec", "bashfleet.s1.ctl", ["bashfleet.s1.ctl"], True),
        # Sent to the any queue, taken there by any host.
        ("bashfleet.any.exec", "bashfleet.any.exec",
         ["bashfleet.s2.exec", "bashfleet.any.exec"], False),
        # Sent to the any queue, pushed onto a host's own queue.
        ("bashfleet.any.exec", "bashfleet.s2.exec",
         ["bashfleet.s2.exec", "bashfleet.any.exec"], True),
        # A pool this host is not in, even taken from that queue.
        ("bashfleet.pool.gpu.exec", "bashfleet.pool.gpu.exec", ["bashfleet.s2.exec"], True),
        # The queue unknown (not delivered by the transport): refused.
        ("bashfleet.s1.exec", None, ["bashfleet.s1.exec"], True),
    ],
)
def test_check_target(target: str, queue: str | None, own: list[str], refused: bool) -> None:
    if not refused:
        check_target(target, queue, own)
        return
    with pytest.raises(AuthError) as caught:
        check_target(target, queue, own)
    assert caught.value.reason == "wrong_target"


# ------------------------------------------------- marks of what workers publish


def test_a_mark_verifies_with_any_key_it_was_made_with() -> None:
    marked = mark([KEY, OLD], "job", "j1", "value")
    for held in ([KEY], [OLD], [KEY, OTHER]):
        check_mark(keyring(held), "job", "j1", "value", marked)


@pytest.mark.parametrize(
    ("keys", "purpose", "name", "value", "reason"),
    [
        ([OTHER], "job", "j1", "value", "unknown_key"),
        ([KEY], "job", "j1", "forged", "bad_signature"),
        ([KEY], "job", "j2", "value", "bad_signature"),  # another job's, copied
        ([KEY], "host", "j1", "value", "bad_signature"),  # another purpose
    ],
)
def test_a_mark_refuses_what_it_did_not_seal(
    keys: list[str], purpose: str, name: str, value: str, reason: str
) -> None:
    marked = mark([KEY, OLD], "job", "j1", "value")
    with pytest.raises(AuthError) as caught:
        check_mark(keyring(keys), purpose, name, value, marked)
    assert caught.value.reason == reason


def test_an_unsealed_value_is_refused_by_a_keyed_reader_only() -> None:
    for marked in ("", mark([], "job", "j1", "value"), "garbage"):
        with pytest.raises(AuthError):
            check_mark(keyring([KEY]), "job", "j1", "value", marked)
        check_mark({}, "job", "j1", "value", marked)  # an unsigned client checks nothing
