"""The native dialect: bash, bash_check, bash_kill, bash_output, and every fact the engine
reports."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.dialects import SessionState, ToolText, schemas
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.worker.wire.control import CheckRequest, KillRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    ProcessInfo,
    RunRequest,
    Spill,
    SystemError_,
    TailLines,
    TruncationInfo,
)

from .native_helpers import JOB, NATIVE, bash, done, tail

HINT = "bash_check id=j1 shows its output; bash_kill id=j1 stops it."


def test_tools() -> None:
    tools = {tool["name"]: tool["input_schema"] for tool in schemas(NATIVE)}
    assert list(tools) == ["bash", "bash_check", "bash_kill", "bash_output", "bash_write"]
    assert list(tools["bash"]["properties"]) == [
        "command",
        "mode",
        "timeout",
        "cwd",
        "host",
        "session",
        "stdin",
        "tty",
    ]
    assert list(tools["bash_write"]["properties"]) == ["id", "input", "close", "timeout"]
    assert tools["bash_write"]["required"] == ["id"]
    assert tools["bash"]["properties"]["mode"]["enum"] == ["default", "slow", "background"]
    assert list(tools["bash_check"]["properties"]) == ["id", "grep", "offset"]
    assert tools["bash_check"]["properties"]["offset"]["type"] == "integer"
    assert list(tools["bash_kill"]["properties"]) == ["id"]
    assert list(tools["bash_output"]["properties"]) == ["id", "offset", "stream", "grep"]


def test_policy() -> None:
    policy = NATIVE.policy()
    assert policy.streams == "separate"
    assert policy.truncation == TailLines(max_lines=2000, max_bytes=51200)
    assert policy.digest_errors is True
    assert policy.default_timeout_s == 120.0
    assert policy.on_timeout == "background"
    # What native shows beyond the other dialects: binary, invisible characters, frames.
    assert policy.detect_binary and policy.reveal_invisible and policy.last_frame
    assert policy.max_line_chars == 2000


def test_arguments_reach_the_runner() -> None:
    session = SessionState(cwd="/default", host="pinned", env={"A": "1"})
    _, runner, _ = bash(
        done(exit_code=0),
        {
            "command": "make",
            "mode": "slow",
            "timeout": 30,
            "cwd": "/src",
            "host": "h9",
            "session": "s1",
        },
        session,
    )
    assert runner.last().request == RunRequest(
        command="make",
        host="h9",
        mode="slow",
        timeout=30.0,
        cwd="/src",
        session="s1",
        default_cwd="/default",  # where a fresh named session starts
        policy=NATIVE.policy(),
        env={"A": "1"},
        capture_state=True,  # a named session: the fleet carries its final state
    )
    _, runner, _ = bash(done(exit_code=0), {"command": "make"}, session)
    options = runner.last().options
    assert (
        options["host"],
        options["cwd"],
        options["mode"],
        options["timeout"],
        options["session"],
    ) == ("pinned", "/default", "default", None, None)


CUT = "[stdout cut: showing the last 2000 of 8500 lines (51200 of 400000 bytes, lines limit). "


@pytest.mark.parametrize(
    ("result", "text", "is_error"),
    [
        (
            done(exit_code=0, stdout="hi\n", cwd="/w"),
            "exit code: 0\nhost h1 · call c1 · 0.50s · cwd /w\n\nstdout:\nhi",
            False,
        ),
        (done(exit_code=0), "exit code: 0\nhost h1 · call c1 · 0.50s\n\n(no output)", False),
        (
            done(exit_code=1, stdout="", stderr="boom\n"),
            "exit code: 1\nhost h1 · call c1 · 0.50s\n\nstderr:\nboom",
            True,
        ),
        (
            done(signal=11, stdout="x\n"),
            "killed by signal SIGSEGV (11)\nhost h1 · call c1 · 0.50s\n\nstdout:\nx",
            True,
        ),
        (
            done(
                exit_code=1,
                stdout="tail\n",
                stderr="warn\n",
                duration_s=41.2,
                stdout_truncation=tail(8500, 2000),
                spill=Spill(host="h1", stdout_path="/spill/c1.out", stderr_path="/spill/c1.err"),
                error_digest=("error: x", "FAIL y"),
            ),
            "exit code: 1\nhost h1 · call c1 · 41.20s\n\n"
            "stdout:\ntail\n"
            + CUT
            + "Full output: bash_output id=c1 (/spill/c1.out on host h1)]\n\n"
            "stderr:\nwarn\n\n"
            "error lines in the cut part:\n  error: x\n  FAIL y",
            True,
        ),
        (
            done(
                exit_code=0,
                stderr="w\n",
                stderr_truncation=tail(3000, 2000, 90000, 60000),
                spill=Spill(
                    host="h1", stdout_path="/o", stderr_path="/spill/c1.err", error="disk full"
                ),
            ),
            "exit code: 0\nhost h1 · call c1 · 0.50s\n\nstderr:\nw\n"
            "[stderr cut: showing the last 2000 of 3000 lines (60000 of 90000 bytes, lines limit)."
            " Full stderr: bash_output id=c1 stream=stderr (/spill/c1.err on host h1, may be "
            "incomplete: disk full)]",
            False,
        ),
        (
            done(exit_code=0, stdout="t\n", stdout_truncation=tail(8500, 2000)),
            "exit code: 0\nhost h1 · call c1 · 0.50s\n\nstdout:\nt\n"
            + CUT
            + "The full output was not kept.]",
            False,
        ),
        (
            done(
                timed_out=True,
                signal=15,
                stdout="p\n",
                processes=(ProcessInfo(pid=99, state="sleeping", cpu_s=0.25, command="sleep 9"),),
                error=SystemError_(
                    kind="internal", message="1 process(es) survived the kill: [99]"
                ),
            ),
            "timed out after 120s; killed by signal SIGTERM (15)\nhost h1 · call c1 · 0.50s\n\n"
            "stdout:\np\n\n"
            "processes at the timeout:\n  pid 99 sleeping, 0.2s CPU: sleep 9\nno output yet\n\n"
            "warning: 1 process(es) survived the kill: [99]",
            True,
        ),
        (
            done(
                error=SystemError_(kind="bad_cwd", message="Working directory does not exist: /x"),
                duration_s=0.0,
            ),
            "system error (bad_cwd): Working directory does not exist: /x\n"
            "host h1 · call c1 · 0.00s",
            True,
        ),
    ],
)
def test_run_texts(result: CallResult, text: str, is_error: bool) -> None:
    answer, _, _ = bash(result)
    assert answer == ToolText(text, is_error=is_error)


def binary(total_bytes: int) -> TruncationInfo:
    return TruncationInfo(
        direction="tail",
        truncated=True,
        limit=None,
        total_lines=3,
        total_bytes=total_bytes,
        shown_lines=0,
        shown_bytes=0,
        binary=True,
    )


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (
            done(
                exit_code=0,
                stdout_truncation=binary(812),
                spill=Spill(host="h1", stdout_path="/spill/c1.out", stderr_path="/spill/c1.err"),
            ),
            "exit code: 0\nhost h1 · call c1 · 0.50s\n\n"
            "stdout:\n[binary output: 812 bytes, saved to /spill/c1.out on host h1]",
        ),
        (
            done(
                exit_code=0,
                stdout="fine\n",
                stderr_truncation=binary(64),
                spill=Spill(host="h1", stdout_path="/spill/c1.out", stderr_path="/spill/c1.err"),
            ),
            "exit code: 0\nhost h1 · call c1 · 0.50s\n\nstdout:\nfine\n\n"
            "stderr:\n[binary output: 64 bytes, saved to /spill/c1.err on host h1]",
        ),
        (
            done(
                exit_code=0,
                stdout_truncation=binary(10),
                spill=Spill(host="h1", error="no spill directory; output kept in memory"),
            ),
            "exit code: 0\nhost h1 · call c1 · 0.50s\n\nstdout:\n"
            "[binary output: 10 bytes, not kept: no spill directory; output kept in memory]",
        ),
        (
            done(exit_code=0, stdout_truncation=binary(10)),
            "exit code: 0\nhost h1 · call c1 · 0.50s\n\nstdout:\n"
            "[binary output: 10 bytes, not kept: no spill file]",
        ),
    ],
)
def test_binary_output_is_reported_not_shown(result: CallResult, text: str) -> None:
    answer, _, _ = bash(result)
    assert answer == ToolText(text)


@pytest.mark.parametrize(("cut", "phrase"), [(1, "1 line"), (3, "3 lines")])
def test_long_lines_are_counted_in_the_cut_notice(cut: int, phrase: str) -> None:
    info = tail(3, 3, 300003, 6030).model_copy(update={"truncated": True, "long_lines_cut": cut})
    result = done(
        exit_code=0,
        stdout="x… [98,000 more characters]\n",
        stdout_truncation=info,
        spill=Spill(host="h1", stdout_path="/spill/c1.out"),
    )
    answer, _, _ = bash(result)
    assert answer.text.endswith(
        "stdout:\nx… [98,000 more characters]\n"
        f"[stdout cut: showing the last 3 of 3 lines (6030 of 300003 bytes); {phrase} cut to "
        "2,000 characters. Full output: bash_output id=c1 (/spill/c1.out on host h1)]"
    )


def test_timed_out_into_background() -> None:
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        stdout="compiling\n",
        duration_s=30.0,
        processes=(ProcessInfo(pid=4242, state="running", cpu_s=29.5, command="make -j8"),),
        last_output_age_s=0.4,
        spill=Spill(host="h2", stdout_path="/jobs/j1.log", stderr_path="/jobs/j1.err"),
    )
    answer, _, session = bash(result, {"command": "make -j8", "timeout": 30})
    assert answer == ToolText(
        "timed out after 30s; still running in background as job j1 on host h2 (pid 4242)\n"
        "host h1 · call c1 · 30.00s\n\n"
        "stdout:\ncompiling\n\n"
        "processes still running:\n  pid 4242 running, 29.5s CPU: make -j8\n"
        "last output 0.4s ago\n\n" + HINT
    )
    assert session.jobs["j1"].stderr_path == "/jobs/j1.err"
    assert session.pids == {4242: "j1"}


def test_checks_read_on_after_the_timeout_notice() -> None:
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        stdout="compiling\n",
        stdout_truncation=tail(1, 1, total_bytes=10, shown_bytes=10),
    )
    _, _, session = bash(result, {"command": "make"})
    assert (session.offsets, session.stderr_offsets) == ({"j1": 10}, {"j1": 0})
    runner = FakeRunner(check=[CheckResult(id="j1", host="h2", running=True, offset=10)])
    answer = NATIVE.call("bash_check", {"id": "j1"}, runner, session)
    assert runner.last().request == CheckRequest(id="j1", offset=10, stderr_offset=0)
    assert "output since byte 10: none" in answer.text
    NATIVE.call("bash_kill", {"id": "j1"}, runner, session)
    assert runner.last().request == KillRequest(id=runner.last().target, offset=10)
    NATIVE.call("bash_kill", {"id": "jother"}, runner, session)
    # Not this session's job: from the job's last check.
    assert runner.last().request == KillRequest(id="jother")


def test_background_mode() -> None:
    answer, runner, session = bash(
        done(backgrounded=True, job=JOB, duration_s=0.01),
        {"command": "serve", "mode": "background"},
    )
    assert runner.last().options["mode"] == "background"
    assert answer == ToolText(
        "started in background as job j1 on host h2 (pid 4242, pgid 4242); "
        "output: /jobs/j1.log\nhost h1 · call c1 · 0.01s\n\n" + HINT
    )
    assert "j1" in session.jobs


def test_slow_timeout_text() -> None:
    answer, _, _ = bash(done(timed_out=True, signal=15), {"command": "make", "mode": "slow"})
    assert answer.text.startswith("timed out after 900s; killed by signal SIGTERM (15)\n")


# ---------------------------------------------------------------------- check / kill


def test_check_reads_on_from_the_last_offset() -> None:
    session = SessionState()
    runner = FakeRunner(
        check=[
            CheckResult(
                id="j1",
                host="h2",
                running=True,
                output="a\nb\n",
                offset=50,
                output_truncation=tail(2, 2),
                output_path="/jobs/j1.log",
            ),
            CheckResult(id="j1", host="h2", running=True, offset=50, output_path="/jobs/j1.log"),
            CheckResult(id="j1", host="h2", running=False, exit_code=0, output="x\n", offset=60),
        ]
    )
    first = NATIVE.call("bash_check", {"id": "j1"}, runner, session)
    assert first == ToolText(
        "job j1 on host h2: running\n\n"
        "output since byte 0 (2 lines):\na\nb\n\n"
        "next offset: 50 (bash_check id=j1 continues from there)"
    )
    second = NATIVE.call("bash_check", {"id": "j1"}, runner, session)
    assert runner.last().request == CheckRequest(id="j1", offset=50, stderr_offset=0)
    assert second.text == (
        "job j1 on host h2: running\n\noutput since byte 50: none\n\n"
        "next offset: 50 (bash_check id=j1 continues from there)"
    )
    third = NATIVE.call("bash_check", {"id": "j1", "offset": 10, "grep": "x"}, runner, session)
    assert runner.last().request == CheckRequest(id="j1", grep="x", offset=10)
    assert third.text == (
        "job j1 on host h2: exited with code 0\n\n"
        "output since byte 10 matching 'x' (1 line):\nx\n\n"
        "next offset: 60 (bash_check id=j1 continues from there)"
    )
    assert session.offsets == {"j1": 60}


def test_check_cut_stderr_and_note() -> None:
    result = CheckResult(
        id="j1",
        host="h2",
        running=False,
        signal=9,
        output="t\n",
        offset=9,
        output_truncation=tail(8500, 2000),
        output_path="/jobs/j1.log",
        stderr_output="e\n",
        note="status unknown",
    )
    answer = NATIVE.call("bash_check", {"id": "j1"}, FakeRunner(check=[result]), SessionState())
    assert answer.text == (
        "job j1 on host h2: killed by signal SIGKILL (9)\n\n"
        "output since byte 0 (8500 lines):\nt\n"
        "[output cut: showing the last 2000 of 8500 lines (51200 of 400000 bytes, lines limit). "
        "Full output: bash_output id=j1 (/jobs/j1.log on host h2)]\n\n"
        "stderr:\ne\n\nnote: status unknown\n\n"
        "next offset: 9 (bash_check id=j1 continues from there)"
    )


@pytest.mark.parametrize(
    ("result", "head", "is_error"),
    [
        (
            CheckResult(id="j1", host="h2", running=False, signal=15),
            "job j1 on host h2: stopped; killed by signal SIGTERM (15)",
            False,
        ),
        (
            CheckResult(id="j1", host="h2", running=False, exit_code=0),
            "job j1 on host h2: stopped; exited with code 0",
            False,
        ),
        (
            CheckResult(id="j1", host="h2", running=False),
            "job j1 on host h2: stopped; ended, exit status unknown",
            False,
        ),
        (
            CheckResult(id="j1", host="h2", running=True, note="1 process(es) survived the kill"),
            "job j1 on host h2: still running after the kill",
            True,
        ),
    ],
)
def test_kill(result: CheckResult, head: str, is_error: bool) -> None:
    session = SessionState()
    session.remember(JOB, "serve")
    runner = FakeRunner(kill=[result.model_copy(update={"output": "bye\n", "offset": 4})])
    answer = NATIVE.call("bash_kill", {"id": "j1"}, runner, session)
    note = "\n\nnote: 1 process(es) survived the kill" if result.note else ""
    assert answer == ToolText(f"{head}\n\nfinal output (1 line):\nbye{note}", is_error=is_error)
    assert session.jobs["j1"].killed is not is_error
    assert session.offsets["j1"] == 4


def test_unknown_job_is_the_fleets_error() -> None:
    runner = FakeRunner(error=LookupError("no such job: j404"))
    answer = NATIVE.call("bash_check", {"id": "j404"}, runner, SessionState())
    assert answer == ToolText("[system error: LookupError: no such job: j404]", True)


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("bash", {}, "missing required parameter 'command'"),
        (
            "bash",
            {"command": "x", "timeout": 0},
            "timeout must be above 0 and at most 86400 seconds",
        ),
        (
            "bash",
            {"command": "x", "timeout": 86401},
            "timeout must be above 0 and at most 86400 seconds",
        ),
        (
            "bash",
            {"command": "x", "mode": "turbo"},
            "parameter 'mode' must be one of 'default', 'slow', 'background', not 'turbo'",
        ),
        ("bash", {"command": "x", "cwd": "\x00"}, "parameter 'cwd' contains a NUL byte"),
        ("bash_check", {}, "missing required parameter 'id'"),
        ("bash_check", {"id": "j1", "offset": -1}, "offset must be 0 or more, not -1"),
        (
            "bash_check",
            {"id": "j1", "offset": 1.5},
            "parameter 'offset' must be an integer, not a number (1.5)",
        ),
        (
            "bash_kill",
            {"id": "j1", "signal": 9},
            "unknown parameter 'signal' (bash_kill takes: id)",
        ),
    ],
)
def test_bad_arguments(tool: str, args: dict[str, object], message: str) -> None:
    runner = FakeRunner()
    assert NATIVE.call(tool, args, runner, SessionState()) == ToolText(f"Error: {message}", True)
    assert runner.calls == []


def test_bad_grep() -> None:
    answer = NATIVE.call("bash_check", {"id": "j1", "grep": "[a"}, FakeRunner(), SessionState())
    assert answer.is_error
    assert answer.text.startswith("Error: grep is not a valid regular expression: ")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(
    ["command", "mode", "timeout", "cwd", "host", "session", "id", "grep", "offset"]
) | st.text(max_size=6)


@given(
    tool=st.sampled_from(["bash", "bash_check", "bash_kill"]) | st.text(max_size=6),
    args=st.dictionaries(keys, json_values, max_size=5) | json_values,
)
@settings(max_examples=400, deadline=None)  # a shared 2-core box: time is not the property
def test_any_arguments_give_a_tool_text(tool: str, args: object) -> None:
    answer = NATIVE.call(tool, args, FakeRunner(), SessionState())  # type: ignore[arg-type]
    assert isinstance(answer, ToolText) and answer.text
