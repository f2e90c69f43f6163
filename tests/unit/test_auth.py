"""worker.wire.auth: HMAC envelopes; every refusal has its kind."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.wire.auth import AuthError, key_id, keyring, sign, verify

KEY, OLD, OTHER = "k" * 32, "old-key-" * 4, "x" * 32
NOW = 1_800_000_000.0
TASK = "bashfleet.exec"
CALL: list[Any] = [{"call_id": "c1", "command": "echo hi", "env": {"A": "1"}}]


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
    assert _kind({"auth": {"key": 1}, "args": CALL}) == "malformed"
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
        lambda e: e.update(v=2),
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
