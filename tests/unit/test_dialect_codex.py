"""The codex dialect as Codex CLI's unified exec behaves, with the fake runner."""

from __future__ import annotations

import random
import re

from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client.dialects import SessionState, get_dialect, schemas
from bashfleet.client.dialects.base import ExecSession
from bashfleet.client.dialects.codex import (
    FORCED_ENV,
    MAX_SESSIONS,
    PIPE_REFUSAL,
    CodexDialect,
    clamp_yield,
    output_tokens,
    prune,
    render,
    shown_output,
    warning_text,
)
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.client.errors import UnknownJob
from bashfleet.worker.engine.output.truncate import head_tail_tokens, tokens, utf8_len
from bashfleet.worker.wire.control import SessionOutput, WriteStdinRequest
from bashfleet.worker.wire.models import (
    CallResult,
    HeadTailTokens,
    InputWait,
    JobHandle,
    RunRequest,
    TruncationInfo,
)

TEXT = re.compile(
    r"\AChunk ID: [0-9a-f]{6}\nWall time: \d+\.\d{4} seconds\n"
    r"(?P<process>Process (?:exited with code -?\d+|running with session ID \d+))\n"
    r"(?P<extra>(?:.+\n)*?)Original token count: (?P<tokens>\d+)\nOutput:\n(?P<output>.*)\Z",
    re.S,
)


def _info(text: str) -> TruncationInfo:
    return head_tail_tokens(text, 10_000).info


def running_result(output: str = "Python 3\n>>> ", job: str = "j1") -> CallResult:
    return CallResult(
        call_id="c1", host="h1", backgrounded=True, combined=True, stdout=output,
        stdout_truncation=_info(output),
        job=JobHandle(id=job, host="h1", pid=10, pgid=10, output_path="/o", stdin="pty"),
        input_wait=InputWait(idle_s=2.0, prompt=">>> ", pid=11, command="python3"),
        read_offset=len(output),
    )


def test_tools_as_the_spec_names_them() -> None:
    tools = {tool["name"]: tool for tool in schemas(get_dialect("codex"))}
    assert list(tools) == ["exec_command", "write_stdin"]
    exec_schema = tools["exec_command"]["input_schema"]
    assert list(exec_schema["properties"]) == [
        "cmd", "workdir", "shell", "tty", "login", "yield_time_ms", "max_output_tokens",
    ]
    assert exec_schema["required"] == ["cmd"]
    assert exec_schema["additionalProperties"] is False
    write_schema = tools["write_stdin"]["input_schema"]
    assert list(write_schema["properties"]) == [
        "session_id", "chars", "yield_time_ms", "max_output_tokens",
    ]
    assert write_schema["required"] == ["session_id"]
    assert write_schema["additionalProperties"] is False
    assert tools["exec_command"]["description"] == (
        "Runs a command in a PTY, returning output or a session ID for ongoing interaction."
    )
    assert tools["write_stdin"]["description"] == (
        "Writes characters to an existing unified exec session and returns recent output."
    )


def test_yield_clamps() -> None:
    table = [
        (None, 10_000, False, 10_000), (None, 250, False, 250), (10, 250, False, 250),
        (99_999, 250, False, 30_000), (1_000, 250, False, 1_000), (None, 250, True, 5_000),
        (100, 250, True, 5_000), (40_000, 250, True, 30_000), (7_000, 250, True, 7_000),
    ]
    for value, default, poll, expected in table:
        assert clamp_yield(value, default, poll=poll) == expected, (value, default, poll)


def test_output_tokens_default_and_floor() -> None:
    assert output_tokens(None) == 10_000
    assert output_tokens(-5) == 0
    assert output_tokens(12.7) == 12


def test_head_tail_truncation_with_marker_and_header() -> None:
    text = "".join(f"line {n}\n" for n in range(1000))  # 7890 bytes
    cut = head_tail_tokens(text, 100)  # 400 bytes: 200 head, 200 tail
    head, _, tail = cut.text.partition("…")
    assert utf8_len(head) == 200 and text.startswith(head)
    marker, _, tail = tail.partition("…")
    assert text.endswith(tail) and utf8_len(tail) == 200
    removed = utf8_len(text) - 400
    assert marker == f"{tokens(removed)} tokens truncated"
    shown = shown_output(cut.text, cut.info)
    assert shown.startswith("Total output lines: 1000\n\nline 0\n")
    assert head_tail_tokens("short", 100).text == "short"
    assert shown_output("short", head_tail_tokens("short", 100).info) == "short"


@given(st.text(max_size=400), st.integers(min_value=0, max_value=60))
def test_head_tail_keeps_utf8_and_budget(text: str, max_tokens: int) -> None:
    cut = head_tail_tokens(text, max_tokens)
    if utf8_len(text) <= max_tokens * 4:
        assert cut.text == text and not cut.info.truncated
        return
    match = re.fullmatch(r"(.*)…(\d+) tokens truncated…(.*)", cut.text, re.S)
    assert match is not None
    head, removed, tail = match.group(1), int(match.group(2)), match.group(3)
    assert text.startswith(head) and text.endswith(tail)
    assert utf8_len(head) + utf8_len(tail) <= max_tokens * 4
    assert removed == tokens(utf8_len(text) - utf8_len(head) - utf8_len(tail))
    assert cut.info.total_bytes == utf8_len(text)


def test_render_sections_joined_by_single_newlines() -> None:
    info = _info("hello\n")
    text = render(chunk="3f9a1c", wall_s=1.00241, exit_code=None, session_id=32244,
                  output="hello\n", info=info)
    assert text == ("Chunk ID: 3f9a1c\nWall time: 1.0024 seconds\n"
                    "Process running with session ID 32244\nOriginal token count: 2\n"
                    "Output:\nhello\n")
    exited = render(chunk="abcdef", wall_s=0.5, exit_code=0, session_id=None, output="",
                    info=_info(""))
    assert "Process exited with code 0\nOriginal token count: 0\nOutput:\n" in exited


def test_exec_command_starts_a_session_and_forces_the_environment() -> None:
    runner = FakeRunner(run=[running_result()])
    state = SessionState()
    dialect = CodexDialect(rng=random.Random(7))
    answer = dialect.call("exec_command", {"cmd": "python3 -i", "tty": True}, runner, state)
    match = TEXT.match(answer.text)
    assert match is not None, answer.text
    session_id = int(match.group("process").rsplit(" ", 1)[1])
    assert 1000 <= session_id <= 99_999
    assert state.exec_sessions[session_id].job_id == "j1" and state.exec_sessions[session_id].tty
    assert match.group("output") == "Python 3\n>>> "
    assert 'Process is waiting for input after printing: ">>> "' in match.group("extra")
    request = runner.last().request
    assert isinstance(request, RunRequest)
    assert request.stdin == "pty" and request.timeout == 10.0 and request.login is True
    assert {k: request.env[k] for k in FORCED_ENV} == FORCED_ENV
    assert isinstance(request.policy.truncation if request.policy else None, HeadTailTokens)


def test_exec_command_that_exits_keeps_no_session() -> None:
    done = CallResult(call_id="c", host="h", exit_code=3, combined=True, stdout="x\n",
                      stdout_truncation=_info("x\n"))
    runner = FakeRunner(run=[done])
    state = SessionState()
    answer = CodexDialect().call("exec_command", {"cmd": "exit 3", "yield_time_ms": 99_999},
                                 runner, state)
    assert "Process exited with code 3" in answer.text and not state.exec_sessions
    request = runner.last().request
    assert isinstance(request, RunRequest)
    assert request.stdin == "closed" and request.timeout == 30.0


def test_write_stdin_writes_polls_and_forgets_an_exited_session() -> None:
    state = SessionState(exec_sessions={4242: ExecSession(job_id="j1", host="h1", tty=True)})
    out = SessionOutput(id="j1", host="h1", running=True, stdin="pty", output="42\n>>> ",
                        output_truncation=_info("42\n>>> "))
    ended = SessionOutput(id="j1", host="h1", running=False, exit_code=0, output="")
    runner = FakeRunner(write=[out, ended])
    dialect = CodexDialect()
    answer = dialect.call("write_stdin", {"session_id": 4242, "chars": "6*7\n"}, runner, state)
    assert "Process running with session ID 4242" in answer.text
    request = runner.last().request
    assert isinstance(request, WriteStdinRequest)
    assert request.data == "6*7\n" and request.collect.delay_s == 0.1
    assert request.collect.wait_s == 0.25
    answer = dialect.call("write_stdin", {"session_id": 4242}, runner, state)
    request = runner.last().request
    assert isinstance(request, WriteStdinRequest) and request.collect.wait_s == 5.0
    assert "Process exited with code 0" in answer.text and not state.exec_sessions


def test_write_stdin_refusals() -> None:
    state = SessionState(exec_sessions={5000: ExecSession(job_id="j2", host="h", tty=False)})
    dialect = CodexDialect()
    runner = FakeRunner(write=[UnknownJob("no such job")])
    refused = dialect.call("write_stdin", {"session_id": 5000, "chars": "y\n"}, runner, state)
    assert refused.is_error and refused.text == PIPE_REFUSAL
    unknown = dialect.call("write_stdin", {"session_id": 7}, runner, state)
    assert unknown.is_error and unknown.text == "Unknown session id 7"
    # A poll of a session whose supervisor is gone: unknown, and forgotten.
    gone = dialect.call("write_stdin", {"session_id": 5000}, runner, state)
    assert gone.is_error and gone.text == "Unknown session id 5000" and not state.exec_sessions


def test_pruning_spares_the_most_recent_and_warns() -> None:
    sessions = {n: ExecSession(job_id=f"j{n}", host="h", last_used=float(n))
                for n in range(1000, 1000 + MAX_SESSIONS)}
    assert prune(sessions) == [1000]
    assert prune({n: sessions[n] for n in list(sessions)[:10]}) == []
    assert warning_text(59) is None and "60 unified exec sessions" in (warning_text(60) or "")
    state = SessionState(exec_sessions=dict(sessions))
    runner = FakeRunner(run=[running_result(job="jnew")])
    CodexDialect(rng=random.Random(1)).call("exec_command", {"cmd": "cat", "tty": True},
                                             runner, state)
    assert 1000 not in state.exec_sessions and len(state.exec_sessions) == MAX_SESSIONS
    killed = [call.target for call in runner.calls if call.method == "kill"]
    assert killed == ["j1000"]
