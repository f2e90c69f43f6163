"""The pi dialect: schema, clamping, cwd, head/tail, interception, result texts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.dialects import PiDialect, SessionState, ToolText, schemas
from bashfleet.client.dialects.pi import format_size, resolve_cwd
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.worker.wire.models import (
    ByteTail,
    CallResult,
    InterceptRule,
    Policy,
    Spill,
    SystemError_,
    TruncationInfo,
)

PI = PiDialect()


def call(
    result: CallResult | None = None,
    args: dict[str, object] | None = None,
    session: SessionState | None = None,
    dialect: PiDialect = PI,
) -> tuple[ToolText, FakeRunner]:
    runner = FakeRunner(run=[result] if result else [])
    session = session if session is not None else SessionState(cwd="/repo")
    return dialect.call(
        "bash", args if args is not None else {"command": "make"}, runner, session
    ), runner


def done(**fields: object) -> CallResult:
    return CallResult(call_id="c1", host="h1", combined=True, **fields)


def test_schema() -> None:
    [tool] = schemas(PI)
    assert tool["name"] == "bash"
    assert tool["input_schema"] == {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Shell command to execute"},
            "timeout": {"type": "number", "description": "Timeout in seconds"},
            "cwd": {"type": "string", "description": "Working directory"},
            # Whole lines: the schema says so, so a model is never refused for a 2.5 the
            # schema allowed.
            "head": {"type": "integer", "minimum": 0,
                     "description": "Return only the first N lines of output"},
            "tail": {"type": "integer", "minimum": 0,
                     "description": "Return only the last N lines of output"},
        },
        "required": ["command"],
    }


def test_policy_without_and_with_interception() -> None:
    policy = PI.policy()
    assert policy.name == "pi"
    assert policy.streams == "combined"
    assert policy.truncation == ByteTail(max_bytes=51200)
    assert policy.lift_head_tail is True
    assert policy.on_timeout == "kill"
    assert (policy.default_timeout_s, policy.max_timeout_s) == (300.0, 3600.0)
    assert policy.intercept == () and policy.available_tools == ()
    assert policy.spill_min_bytes == 51200  # an artifact only past the 50 KB kept in view
    rule = InterceptRule(pattern=r"^\s*cat\s", tool="read", message="Use the read tool.")
    custom = PiDialect(intercept=[rule], available_tools=["read", "grep"]).policy()
    assert custom.intercept == (rule,)
    assert custom.available_tools == ("read", "grep")
    _, runner = call(done(exit_code=0), dialect=PiDialect(intercept=[rule]))
    sent = runner.last().options["policy"]
    assert isinstance(sent, Policy) and sent.intercept == (rule,)


@pytest.mark.parametrize(
    ("timeout", "sent"),
    [
        (None, 300.0),
        (0, 1.0),
        (-5, 1.0),
        (0.5, 1.0),
        (1, 1.0),
        (42.5, 42.5),
        (3600, 3600.0),
        (5000, 3600.0),
        (1e300, 3600.0),
    ],
)
def test_timeout_is_clamped(timeout: float | None, sent: float) -> None:
    _, runner = call(done(exit_code=0), {"command": "sleep 1", "timeout": timeout})
    assert runner.last().options["timeout"] == sent


@pytest.mark.parametrize(
    ("cwd", "session_cwd", "sent"),
    [
        (None, "/repo", "/repo"),
        ("", "/repo", "/repo"),
        ("sub/dir", "/repo", "/repo/sub/dir"),
        ("../other", "/repo/a", "/repo/other"),
        ("/abs", "/repo", "/abs"),
        ("~/x", "/repo", "~/x"),
        ("rel", None, "rel"),
        (None, None, None),
    ],
)
def test_cwd_resolves_against_the_session(
    cwd: str | None, session_cwd: str | None, sent: str | None
) -> None:
    assert resolve_cwd(cwd, session_cwd) == sent
    _, runner = call(
        done(exit_code=0), {"command": "ls", "cwd": cwd}, SessionState(cwd=session_cwd)
    )
    assert runner.last().options["cwd"] == sent


def test_head_and_tail_reach_the_runner() -> None:
    _, runner = call(done(exit_code=0), {"command": "seq 100", "head": 10, "tail": 3.0})
    assert (runner.last().options["head"], runner.last().options["tail"]) == (10, 3)
    assert isinstance(runner.last().options["tail"], int)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "missing required parameter 'command'"),
        ({"command": "ls", "head": -1}, "parameter 'head' must be at least 0, not -1"),
        (
            {"command": "ls", "tail": 2.5},
            "parameter 'tail' must be an integer, not a number (2.5)",
        ),
        (
            {"command": "ls", "timeout": "10"},
            "parameter 'timeout' must be a number, not a string ('10')",
        ),
        ({"command": "ls", "cwd": "a\x00b"}, "parameter 'cwd' contains a NUL byte"),
        (
            {"command": "ls", "pty": True},
            "unknown parameter 'pty' (bash takes: command, timeout, cwd, head, tail)",
        ),
    ],
)
def test_bad_arguments(args: dict[str, object], message: str) -> None:
    answer, runner = call(None, args)
    assert answer == ToolText(f'Validation failed for tool "bash":\n  - {message}', True)
    assert runner.calls == []


def cut(first: int, total: int, limit: str = "bytes") -> TruncationInfo:
    return TruncationInfo(
        direction="tail",
        truncated=True,
        limit=limit,
        total_lines=total,
        total_bytes=200000,
        shown_lines=total - first + 1,
        shown_bytes=51200,
        shown_ranges=((first, total),),
    )


@pytest.mark.parametrize(
    ("result", "text", "is_error"),
    [
        (done(exit_code=0, stdout="hello\n"), "hello\n", False),
        (done(exit_code=0, stdout=""), "(no output)", False),
        (done(exit_code=1, stdout="fail\n"), "fail\n\n\nCommand exited with code 1", True),
        (done(exit_code=3, stdout=""), "(no output)\n\nCommand exited with code 3", True),
        (done(signal=9, stdout="x"), "x\n\nCommand failed: missing exit status", True),
        (
            done(
                exit_code=0,
                stdout="last\n",
                stdout_truncation=cut(1201, 3400),
                spill=Spill(host="h1", stdout_path="/spill/c1.log"),
            ),
            "last\n\n\n[Showing lines 1201-3400 of 3400 (50.0KB limit). Full: artifact://c1]",
            False,
        ),
        (
            done(exit_code=0, stdout="last\n", stdout_truncation=cut(1201, 3400)),
            "last\n\n\n[Showing lines 1201-3400 of 3400 (50.0KB limit)]",
            False,
        ),
        (
            done(
                exit_code=2,
                stdout="e\n",
                stdout_truncation=cut(10, 20, limit="lines"),
                spill=Spill(host="h1", stdout_path="/spill/c1.log"),
            ),
            "e\n\n\n[Showing lines 10-20 of 20. Full: artifact://c1]\n\nCommand exited with code 2",
            True,
        ),
        # As pi's `OutputSink.dump(notice)`: the timeout annotation comes first, then the
        # partial output.
        (
            done(timed_out=True, signal=15, stdout="partial\n"),
            "[Command timed out after 300 seconds]\npartial\n",
            True,
        ),
        (
            done(timed_out=True, signal=15, stdout=""),
            "[Command timed out after 300 seconds]\n",
            True,
        ),
        (
            done(
                cancelled=True,
                signal=15,
                stdout="so far\n",
                error=SystemError_(kind="internal", message="call cancelled"),
            ),
            "[Command cancelled]\nso far\n",
            True,
        ),
        (
            done(
                timed_out=True,
                signal=15,
                stdout="tail\n",
                stdout_truncation=cut(5, 9),
                spill=Spill(host="h1", stdout_path="/spill/c1.log"),
            ),
            "[Command timed out after 300 seconds]\ntail\n\n\n"
            "[Showing lines 5-9 of 9 (50.0KB limit). Full: artifact://c1]",
            True,
        ),
        (
            done(
                error=SystemError_(
                    kind="bad_cwd", message="Working directory does not exist: /repo/nope"
                )
            ),
            "Working directory does not exist: /repo/nope",
            True,
        ),
        (
            done(
                error=SystemError_(
                    kind="bad_cwd", message="Working directory is not a directory: /repo/f"
                )
            ),
            "Working directory is not a directory: /repo/f",
            True,
        ),
        (
            done(
                error=SystemError_(
                    kind="blocked",
                    message="Blocked: Use the read tool to read files instead of cat/head/tail.\n\n"
                    "Original command: cat README.md",
                )
            ),
            "Blocked: Use the read tool to read files instead of cat/head/tail.\n\n"
            "Original command: cat README.md",
            True,
        ),
    ],
)
def test_result_texts(result: CallResult, text: str, is_error: bool) -> None:
    answer, _ = call(result)
    assert answer == ToolText(text, is_error=is_error)


def _head_info(total_lines: int, total_bytes: int, shown: int) -> TruncationInfo:
    return TruncationInfo(direction="head", truncated=True, limit="lines",
                          total_lines=total_lines, total_bytes=total_bytes, shown_lines=shown,
                          shown_bytes=2 * shown, shown_ranges=((1, shown),))


@pytest.mark.parametrize(
    ("result", "text"),
    [
        # `head: 3` on `seq 1 100000` once showed lines 91468-91470 under a notice about
        # the tail; the engine now gives the first lines and says so.
        (done(exit_code=0, stdout="1\n2\n3\n", stdout_truncation=_head_info(100000, 588895, 3),
              spill=Spill(host="h1", stdout_path="/spill/c1.log")),
         "1\n2\n3\n\n\n[Showing lines 1-3 of 100000. Full: artifact://c1]"),
        # A head of an output the sink kept whole: no notice, as in pi.
        (done(exit_code=0, stdout="1\n2\n", stdout_truncation=_head_info(5, 10, 2)), "1\n2\n"),
    ],
)
def test_the_notice_of_a_head_says_exactly_what_is_shown(result: CallResult, text: str) -> None:
    assert call(result)[0] == ToolText(text)


def test_timeout_text_uses_the_clamped_timeout() -> None:
    answer, _ = call(done(timed_out=True, signal=15), {"command": "sleep 9", "timeout": 0.2})
    assert answer.text == "[Command timed out after 1 seconds]\n"
    answer, _ = call(done(timed_out=True, signal=15), {"command": "sleep 9", "timeout": 2.5})
    assert answer.text == "[Command timed out after 2.5 seconds]\n"


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0B"), (1023, "1023B"), (1024, "1.0KB"), (51200, "50.0KB"), (1536 * 1024, "1.5MB")],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


def test_runner_failure_is_the_bare_message() -> None:
    answer = PI.call(
        "bash", {"command": "ls"}, FakeRunner(error=ConnectionError("refused")), SessionState()
    )
    assert answer == ToolText("ConnectionError: refused", True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(["command", "timeout", "cwd", "head", "tail"]) | st.text(max_size=6)


@given(
    tool=st.sampled_from(["bash"]) | st.text(max_size=6),
    args=st.dictionaries(keys, json_values, max_size=5) | json_values,
    session_cwd=st.none() | st.text(max_size=8),
)
@settings(max_examples=400, deadline=None)  # a shared 2-core box: time is not the property
def test_any_arguments_give_a_tool_text(tool: str, args: object, session_cwd: str | None) -> None:
    answer = PI.call(tool, args, FakeRunner(), SessionState(cwd=session_cwd))  # type: ignore[arg-type]
    assert isinstance(answer, ToolText) and answer.text
