"""bashfleet.worker.wire.models: the wire contract refuses what bash or the fleet cannot take."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bashfleet.worker.wire.models import (
    MAX_COMMAND_BYTES,
    MAX_TIMEOUT_S,
    ByteTail,
    Call,
    CharCap,
    Middle,
    Policy,
    TailLines,
    TruncationInfo,
)


def _call(**fields: Any) -> Call:
    base: dict[str, Any] = {"call_id": "c1", "command": "echo hi"}
    base.update(fields)
    return Call.model_validate(base)


def test_a_plain_call_is_accepted_with_defaults() -> None:
    call = _call()
    assert call.command == "echo hi"
    assert call.timeout_s is None
    assert call.env == {}
    assert call.policy == Policy()
    assert isinstance(call.policy.truncation, TailLines)


@pytest.mark.parametrize("command", ["echo \x00", "\x00", "a\x00b"])
def test_command_with_nul_is_refused(command: str) -> None:
    with pytest.raises(ValidationError, match="NUL"):
        _call(command=command)


def test_command_size_limit_is_in_utf8_bytes() -> None:
    _call(command="x" * MAX_COMMAND_BYTES)
    with pytest.raises(ValidationError, match="limit"):
        _call(command="x" * (MAX_COMMAND_BYTES + 1))
    # Under the limit in characters, over it in bytes.
    with pytest.raises(ValidationError, match="limit"):
        _call(command="é" * (MAX_COMMAND_BYTES // 2 + 1))


@pytest.mark.parametrize("command", ["", " ", "\n\t  \n"])
def test_empty_or_blank_command_is_refused(command: str) -> None:
    with pytest.raises(ValidationError):
        _call(command=command)


@pytest.mark.parametrize(
    "env",
    [{"": "x"}, {"A=B": "x"}, {"A\x00": "x"}, {"A": "x\x00y"}],
)
def test_bad_environment_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="environment"):
        _call(env=env)


def test_good_environment_is_accepted() -> None:
    assert _call(env={"FOO": "bar=baz", "EMPTY": ""}).env == {"FOO": "bar=baz", "EMPTY": ""}


@pytest.mark.parametrize("timeout", [0, -1, -0.001, MAX_TIMEOUT_S + 0.001, 1e12,
                                     float("nan"), float("inf")])
def test_bad_timeout_is_refused(timeout: float) -> None:
    with pytest.raises(ValidationError):
        _call(timeout_s=timeout)


@pytest.mark.parametrize("timeout", [0.001, 1, 120, MAX_TIMEOUT_S])
def test_good_timeout_is_accepted(timeout: float) -> None:
    assert _call(timeout_s=timeout).timeout_s == timeout


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        _call(commnd="typo")
    with pytest.raises(ValidationError, match="Extra inputs"):
        _call(policy={"name": "x", "truncaton": {}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        TailLines.model_validate({"max_lines": 5, "max_byte": 5})


@pytest.mark.parametrize(
    "call_id", ["", "a b", "a/b", "../x", "a\nb", "abc\n", "é", "a;b", "x" * 65, "$(id)"]
)
def test_bad_call_id_is_refused(call_id: str) -> None:
    with pytest.raises(ValidationError):
        _call(call_id=call_id)


@pytest.mark.parametrize("call_id", ["a", "A-b_c.d", "0123", "x" * 64, "run.2024-01-01_1"])
def test_good_call_id_is_accepted(call_id: str) -> None:
    assert _call(call_id=call_id).call_id == call_id


def test_negative_head_or_tail_is_refused() -> None:
    with pytest.raises(ValidationError):
        _call(head=-1)
    with pytest.raises(ValidationError):
        _call(tail=-1)
    assert _call(head=0, tail=0).head == 0


def test_models_are_frozen() -> None:
    call = _call()
    with pytest.raises(ValidationError):
        call.command = "rm -rf /"  # type: ignore[misc]


def test_truncation_policy_round_trips_through_json_by_kind() -> None:
    for truncation in (TailLines(), Middle(), CharCap(), ByteTail(max_bytes=7)):
        call = _call(policy=Policy(truncation=truncation))
        again = Call.model_validate_json(call.model_dump_json())
        assert again == call
        assert type(again.policy.truncation) is type(truncation)


@pytest.mark.parametrize(
    "policy",
    [
        {"kind": "tail_lines", "max_lines": 0},
        {"kind": "byte_tail", "max_bytes": 0},
        {"kind": "char_cap", "max_chars": -5},
        {"kind": "middle", "keep_bytes": 0},
        {"kind": "nope"},
    ],
)
def test_bad_truncation_policy_is_refused(policy: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _call(policy={"truncation": policy})


def test_truncation_info_defaults() -> None:
    info = TruncationInfo(direction="tail", truncated=False, limit=None, total_lines=0,
                          total_bytes=0, shown_lines=0, shown_bytes=0)
    assert info.shown_ranges == ()
    assert not info.partial_line


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_command_validation_matches_the_rules(command: str) -> None:
    ok = "\x00" not in command and command.strip() != ""
    try:
        call = _call(command=command)
    except ValidationError:
        assert not ok
    else:
        assert ok
        assert call.command == command  # never altered


def test_lone_surrogate_in_command_is_refused() -> None:
    # It could not be passed to exec: refused on the way in, not at spawn time.
    with pytest.raises(ValidationError):
        _call(command="echo \ud800")
