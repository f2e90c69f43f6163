"""One request model: the fields a caller's `RunRequest` and a worker's `Call` share are
declared once (`CallOptions`), `build_call` carries every one of them, and what a request
leaves unchecked is refused, with the same words as before, when its call is built."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client._core.messages import build_call, decode_result, run_request
from bashfleet.client.errors import CallRejected
from bashfleet.worker.wire import auth
from bashfleet.worker.wire.models import (
    CANCELLED_MESSAGE,
    MAX_COMMAND_BYTES,
    Call,
    CallOptions,
    RunRequest,
    TermSize,
)

SHARED = frozenset(CallOptions.model_fields)


def _declared_by(model: type[CallOptions]) -> set[str]:
    """The fields `model` declares itself (not those it inherits)."""
    return set(vars(model).get("__annotations__", {}))


def test_shared_fields_are_declared_once() -> None:
    for model in (Call, RunRequest):
        assert set(model.model_fields) >= SHARED
        assert not _declared_by(model) & SHARED, model.__name__


def test_the_fields_both_add_mean_different_things() -> None:
    """A field both models declare for themselves differs in meaning or default: the id
    a call must have / a request may give, the policy a call runs under / a request's
    None for the native one, the input wait a call applies / a request's None for it."""
    assert _declared_by(Call) & _declared_by(RunRequest) == {"call_id", "policy", "input_wait_s"}


def test_a_calls_wire_fields_are_unchanged() -> None:
    """The JSON a client sends and a worker reads: the same names as ever."""
    sent = Call(call_id="c1", command="true").model_dump(mode="json")
    assert set(sent) == {
        "call_id", "command", "cwd", "timeout_s", "background", "env", "unset_env",
        "capture_state", "head", "tail", "policy", "owner", "isolation", "network",
        "session", "tags", "stdin", "term_size", "shell", "login", "input_wait_s",
        "workspace",
    }


#: A valid value of every shared field: a field added to `CallOptions` without one here
#: fails `test_every_shared_field_has_a_strategy`.
_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,7}", fullmatch=True).filter(
    lambda name: not name.startswith("LD_") and name not in ("ENV", "IFS", "PS4"))
_LINE = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
SHARED_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "command": _LINE.filter(str.strip),
    "cwd": st.none() | _LINE.map(lambda text: "/" + text),
    "env": st.dictionaries(_NAME, _LINE, max_size=3),
    "unset_env": st.lists(_NAME, max_size=3).map(tuple),
    "capture_state": st.booleans(),
    "head": st.none() | st.integers(0, 10**6),
    "tail": st.none() | st.integers(0, 10**6),
    "isolation": st.sampled_from([None, "none", "process", "strict"]),
    "network": st.sampled_from([None, "none", "egress", "host", "allow=a.com,10.1.0.0/16"]),
    "session": st.none() | st.text("abc123-_", min_size=1, max_size=64),
    "tags": st.dictionaries(st.text("abz09._-", min_size=1, max_size=8), _LINE.filter(
        lambda value: "\n" not in value and "\r" not in value), max_size=3),
    "stdin": st.sampled_from(["null", "closed", "pipe", "pty"]),
    "term_size": st.none() | st.builds(TermSize, rows=st.integers(1, 1000),
                                       cols=st.integers(1, 1000)),
    "shell": st.sampled_from([None, "bash", "/bin/zsh", "sh", "./my-shell+1"]),
    "login": st.booleans(),
    "workspace": st.none() | st.from_regex(r"w[0-9a-f]{15}", fullmatch=True),
}


def test_every_shared_field_has_a_strategy() -> None:
    assert set(SHARED_VALUES) == SHARED


@given(options=st.fixed_dictionaries(SHARED_VALUES),
       default_cwd=st.none() | st.just("/srv/start"))
def test_build_call_carries_every_shared_field(
    options: dict[str, Any], default_cwd: str | None
) -> None:
    request = RunRequest(**options, default_cwd=default_cwd)
    call = build_call(request, "agent:a")
    for name in SHARED - {"cwd"}:
        assert getattr(call, name) == getattr(request, name), name
    assert call.cwd == (request.cwd or default_cwd)
    assert call.owner == "agent:a"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"command": ""}, "command: String should have at least 1 character"),
        ({"command": " \n\t"}, "command: Value error, command is empty"),
        ({"command": "echo a\x00b"},
         "command: Value error, command contains a NUL byte, which bash cannot receive"),
        ({"command": "x" * (MAX_COMMAND_BYTES + 1)},
         f"command: Value error, command is {MAX_COMMAND_BYTES + 1} bytes; the limit is "
         f"{MAX_COMMAND_BYTES}: write long scripts to a file and run the file"),
        # A lone surrogate could not be passed to exec.
        ({"command": "echo \ud800"},
         "command: Input should be a valid string, unable to parse raw data as a unicode "
         "string"),
        ({"session": "s\ud800"},
         "session: Input should be a valid string, unable to parse raw data as a unicode "
         "string"),
        ({"cwd": "a\x00b"},
         "cwd: Value error, cwd must be a path without NUL bytes, at most 4096 characters"),
        # The request's default_cwd becomes the call's cwd, and is checked as one.
        ({"default_cwd": "a\x00b"},
         "cwd: Value error, cwd must be a path without NUL bytes, at most 4096 characters"),
        ({"env": {"A=B": "x"}}, "env: Value error, invalid environment variable 'A=B'"),
        ({"env": {"LD_PRELOAD": "x"}},
         "env: Value error, environment variable LD_PRELOAD is refused: it makes bash (or "
         "the dynamic loader) run code before the command does"),
        ({"session": "s" * 65}, "session: String should have at most 64 characters"),
        ({"shell": "b" * 257}, "shell: String should have at most 256 characters"),
        ({"shell": "ba sh"}, "shell: String should match pattern '^[A-Za-z0-9_./+-]+$'"),
        ({"shell": "bash\n"}, "shell: String should match pattern '^[A-Za-z0-9_./+-]+$'"),
        ({"timeout": 0}, "timeout_s: Input should be greater than 0"),
        ({"call_id": "a b"}, "call_id: String should match pattern '^[A-Za-z0-9_.-]+$'"),
    ],
)
def test_a_request_is_checked_when_its_call_is_built(
    options: dict[str, Any], message: str
) -> None:
    """A runner takes any such request (a dialect builds it from what a model sent); its
    call refuses it, as a CallRejected that says what is wrong."""
    fields = {"command": "ls", **options}
    request = RunRequest(**fields)
    with pytest.raises(CallRejected) as refused:
        build_call(request)
    assert refused.value.message == f"invalid call: {message}"
    command = fields.pop("command")
    assert run_request(command, fields) == request


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "turbo"},
         "mode: Value error, mode must be default, slow or background, not 'turbo'"),
        ({"head": -1}, "head: Input should be greater than or equal to 0"),
        ({"workspace": "w1"}, "workspace: String should match pattern '^w[0-9a-f]{15}$'"),
        ({"nope": 1}, "nope: Extra inputs are not permitted"),
    ],
)
def test_a_request_refuses_what_it_checks_itself(options: dict[str, Any], message: str) -> None:
    with pytest.raises(CallRejected) as refused:
        run_request("ls", options)
    assert refused.value.message == f"invalid call: {message}"


@pytest.mark.parametrize(
    ("mode", "timeout", "timeout_s", "background"),
    [
        ("default", None, None, False),
        ("slow", None, 900.0, False),
        ("slow", 5.0, 5.0, False),
        ("background", None, None, True),
        ("default", 7.5, 7.5, False),
    ],
)
def test_build_call_applies_the_mode(
    mode: str, timeout: float | None, timeout_s: float | None, background: bool
) -> None:
    call = build_call(RunRequest(command="ls", mode=mode, timeout=timeout))
    assert (call.timeout_s, call.background) == (timeout_s, background)


@pytest.mark.parametrize(
    ("kind", "message", "read_as"),
    [
        ("cancelled", CANCELLED_MESSAGE, "cancelled"),
        ("cancelled", "any words at all", "cancelled"),
        # A cancel is known by its kind only: the words alone never make one.
        ("internal", CANCELLED_MESSAGE, "internal"),
        ("internal", "call c1 was cancelled before it started; it did not run", "internal"),
    ],
)
def test_a_cancel_is_its_kind_never_its_words(kind: str, message: str, read_as: str) -> None:
    text = json.dumps({"call_id": "c1", "host": "h",
                       "error": {"kind": kind, "message": message}})
    result = decode_result({}, "c1", auth.seal(None, auth.REPLY, "c1", text))
    assert result.error is not None and result.error.kind == read_as
