"""The pipe dialect: schema, policy, every result text, pid -> job mapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.dialects import PipeDialect, SessionState, ToolText, schemas
from bashfleet.client.dialects.testing import FakeCall, FakeRunner
from bashfleet.worker.wire.control import CheckRequest, KillRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    JobHandle,
    Policy,
    ProcessInfo,
    Spill,
    SystemError_,
    TailLines,
    TruncationInfo,
)

#: The pipe tool's schema, verbatim.
SEED_SCHEMA = {
    "name": "bash",
    "description": (
        "Execute a bash command. Output truncated to last 2000 lines or 50KB; if truncated, "
        "full output saved to temp file. Commands exceeding timeout are auto-backgrounded."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command to execute"},
            "timeout": {
                "type": "integer",
                "description": "Timeout in ms before auto-backgrounding (default: 120000)",
            },
            "check_pid": {
                "type": "integer",
                "description": "Check on a backgrounded process, return new output",
            },
            "kill_pid": {
                "type": "integer",
                "description": "Kill a backgrounded process, return final output",
            },
        },
    },
}

PIPE = PipeDialect()
JOB = JobHandle(id="j7f3a", host="h1", pid=12345, pgid=12345, output_path="/spill/c1.out")


def tail(
    total: int,
    shown: int,
    *,
    total_bytes: int = 0,
    shown_bytes: int = 0,
    limit: str = "lines",
    partial: bool = False,
) -> TruncationInfo:
    """Counts of a tail cut (truncated when shown < total or partial)."""
    return TruncationInfo(
        direction="tail",
        truncated=shown < total or partial,
        limit=limit if shown < total or partial else None,
        total_lines=total,
        total_bytes=total_bytes,
        shown_lines=shown,
        shown_bytes=shown_bytes,
        partial_line=partial,
        shown_ranges=((total - shown + 1, total),) if shown else (),
    )


def run(
    result: CallResult, args: dict[str, object] | None = None, session: SessionState | None = None
) -> tuple[ToolText, FakeRunner, SessionState]:
    runner = FakeRunner(run=[result])
    session = session if session is not None else SessionState()
    answer = PIPE.call("bash", args if args is not None else {"command": "make"}, runner, session)
    return answer, runner, session


def done(**fields: object) -> CallResult:
    return CallResult(call_id="c1", host="h1", **fields)


# ---------------------------------------------------------------------- schema, policy


def test_schema_is_the_seeds() -> None:
    assert schemas(PIPE, style="function") == [SEED_SCHEMA]


def test_policy() -> None:
    assert PIPE.policy() == Policy(
        name="pipe",
        streams="separate",
        truncation=TailLines(max_lines=2000, max_bytes=51200),
        default_timeout_s=120.0,
        on_timeout="background",
        spill_min_bytes=51200,
        kill_grace_s=0.0,
    )


def test_run_sends_the_policy_timeout_and_session() -> None:
    session = SessionState(cwd="/src", env={"A": "1"}, host="h1")
    _, runner, _ = run(done(exit_code=0), {"command": "make", "timeout": 5000}, session)
    call = runner.last()
    assert call.method == "run" and call.target == "make"
    assert call.options["timeout"] == 5.0
    assert call.options["cwd"] == "/src"
    assert call.options["env"] == {"A": "1"}
    assert call.options["host"] == "h1"
    assert call.options["policy"] == PIPE.policy()
    _, runner, _ = run(done(exit_code=0))
    assert runner.last().options["timeout"] == 120.0
    assert runner.last().options["env"] == {}


# --------------------------------------------------------------------- normal results


@pytest.mark.parametrize(
    ("result", "text", "is_error"),
    [
        (
            done(exit_code=0, stdout="hello\n"),
            "stdout:\nhello\n\nstderr:\n\n\nexit code: 0",
            False,
        ),
        (
            done(exit_code=2, stdout="", stderr="make: *** [all] Error 2\n"),
            "stdout:\n\n\nstderr:\nmake: *** [all] Error 2\n\nexit code: 2",
            True,
        ),
        (
            done(signal=9, stdout="a\n"),
            "stdout:\na\n\nstderr:\n\n\nexit code: 137 (killed by SIGKILL)",
            True,
        ),
        (
            done(exit_code=0, stdout="a\n", stdout_truncation=tail(1, 1)),
            "stdout:\na\n\nstderr:\n\n\nexit code: 0",
            False,
        ),
        (
            done(
                exit_code=0,
                stdout="tail\n",
                stdout_truncation=tail(8500, 2000, total_bytes=90000, shown_bytes=20000),
                spill=Spill(
                    host="h1",
                    stdout_path="/tmp/pipe-bash-a1b2c3d4.log",
                    stderr_path="/e",
                    stdout_bytes=90000,
                ),
            ),
            "stdout:\ntail\n\nstderr:\n\n\nexit code: 0\n\n"
            "[stdout: Showing last 2000 of 8500 lines. Full output: /tmp/pipe-bash-a1b2c3d4.log]",
            False,
        ),
        (
            done(exit_code=0, stdout="t\n", stdout_truncation=tail(3000, 2000)),
            "stdout:\nt\n\nstderr:\n\n\nexit code: 0\n\n"
            "[stdout: Showing last 2000 of 3000 lines. Full output not saved (50KB or less); "
            "rerun the command piped to head or sed to see the rest.]",
            False,
        ),
        (
            done(
                exit_code=0,
                stdout="o\n",
                stderr="e\n",
                stdout_truncation=tail(8500, 2000),
                stderr_truncation=tail(4000, 1500),
                spill=Spill(host="h1", stdout_path="/o", stderr_path="/e", error="disk full"),
            ),
            "stdout:\no\n\nstderr:\ne\n\nexit code: 0\n\n"
            "[stdout: Showing last 2000 of 8500 lines. "
            "Full output file may be incomplete: /o (disk full)]\n\n"
            "[stderr: Showing last 1500 of 4000 lines. "
            "Full output file may be incomplete: /e (disk full)]",
            False,
        ),
        (
            done(
                exit_code=0,
                stdout="xxxx",
                stdout_truncation=tail(
                    1, 1, total_bytes=80000, shown_bytes=51200, limit="bytes", partial=True
                ),
                spill=Spill(host="h1", stdout_path="/o"),
            ),
            "stdout:\nxxxx\n\nstderr:\n\n\nexit code: 0\n\n"
            "[stdout: Showing last 51200 of 80000 bytes. Full output: /o]",
            False,
        ),
        (
            done(
                exit_code=0,
                stdout="ok\n",
                error=SystemError_(kind="internal", message="1 process(es) survived the kill"),
            ),
            "stdout:\nok\n\nstderr:\n\n\nexit code: 0\n\n"
            "[warning: 1 process(es) survived the kill]",
            False,
        ),
    ],
)
def test_completion_texts(result: CallResult, text: str, is_error: bool) -> None:
    answer, _, _ = run(result)
    assert answer == ToolText(text, is_error=is_error)


def test_system_error() -> None:
    result = done(
        error=SystemError_(kind="bad_cwd", message="Working directory does not exist: /x")
    )
    answer, _, _ = run(result)
    assert answer == ToolText("[system error: Working directory does not exist: /x]", True)


# ------------------------------------------------------------------------- background


def test_backgrounded_text_and_pid_mapping() -> None:
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        stdout="compiling\n",
        spill=Spill(host="h1", stdout_path="/spill/c1.out", stderr_path="/spill/c1.err"),
    )
    answer, _, session = run(result, {"command": "make -j8"})
    assert answer == ToolText(
        "[Command backgrounded after 120s timeout (pid 12345). Partial output:\n\n"
        "stdout:\ncompiling\n\n"
        "stderr:\n\n\n"
        "Full output: /spill/c1.out\n"
        "Use check_pid or kill_pid to manage.]"
    )
    assert session.pids == {12345: "j7f3a"}
    job = session.jobs["j7f3a"]
    assert job.command == "make -j8" and job.stderr_path == "/spill/c1.err"


def test_backgrounded_with_timeout_stderr_and_cut() -> None:
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        stdout="x\n",
        stderr="warn\n",
        stdout_truncation=tail(3000, 2000),
        spill=Spill(
            host="h1",
            stdout_path="/spill/c1.out",
            stderr_path="/spill/c1.err",
            stdout_bytes=10,
            stderr_bytes=5,
        ),
    )
    answer, runner, _ = run(result, {"command": "make", "timeout": 1500})
    assert runner.last().options["timeout"] == 1.5
    assert answer.text == (
        "[Command backgrounded after 1.5s timeout (pid 12345). Partial output:\n\n"
        "stdout (last 2000 of 3000 lines):\nx\n\n"
        "stderr:\nwarn\n\n"
        "Full output: /spill/c1.out\nFull stderr: /spill/c1.err\n"
        "Use check_pid or kill_pid to manage.]"
    )
    assert not answer.is_error


def test_backgrounded_lists_what_still_runs_and_its_last_output() -> None:
    """After the backgrounded text, the call's live processes and its output's age."""
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        stdout="compiling\n",
        spill=Spill(host="h1", stdout_path="/spill/c1.out", stderr_path="/spill/c1.err"),
        processes=(
            ProcessInfo(pid=12345, state="sleeping", cpu_s=0.01, command="bash -c make -j8"),
            ProcessInfo(pid=12350, state="running", cpu_s=118.25, command="cc1 -O2 big.c"),
        ),
        last_output_age_s=61.04,
    )
    answer, _, _ = run(result, {"command": "make -j8"})
    assert answer == ToolText(
        "[Command backgrounded after 120s timeout (pid 12345). Partial output:\n\n"
        "stdout:\ncompiling\n\n"
        "stderr:\n\n\n"
        "Full output: /spill/c1.out\n"
        "Use check_pid or kill_pid to manage.]\n\n"
        "[Processes still running:\n"
        "  pid 12345 sleeping, 0.0s CPU: bash -c make -j8\n"
        "  pid 12350 running, 118.2s CPU: cc1 -O2 big.c\n"
        "Last output 61.0s ago.]"
    )


def test_backgrounded_without_output_or_processes_listed() -> None:
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        last_output_age_s=None,
        processes=(ProcessInfo(pid=1, state="sleeping", cpu_s=0, command="sleep 9"),),
    )
    answer, _, _ = run(result, {"command": "sleep 9"})
    assert answer.text.endswith(
        "Use check_pid or kill_pid to manage.]\n\n"
        "[Processes still running:\n  pid 1 sleeping, 0.0s CPU: sleep 9\nNo output yet.]"
    )
    only_age = done(timed_out=True, backgrounded=True, job=JOB, last_output_age_s=2)
    answer, _, _ = run(only_age, {"command": "sleep 9"})
    assert answer.text.endswith("manage.]\n\n[Last output 2.0s ago.]")


def _session_with_job() -> SessionState:
    session = SessionState()
    session.remember(JOB, "make", stderr_path="/spill/c1.err")
    return session


def test_checks_read_on_after_the_backgrounded_notice() -> None:
    """The notice's partial output is the first look: check_pid and kill_pid skip it."""
    result = done(
        timed_out=True,
        backgrounded=True,
        job=JOB,
        stdout="compiling\n",
        stderr="warn\n",
        stdout_truncation=tail(1, 1, total_bytes=10, shown_bytes=10),
        stderr_truncation=tail(1, 1, total_bytes=5, shown_bytes=5),
        spill=Spill(host="h1", stdout_path="/spill/c1.out", stderr_path="/spill/c1.err"),
    )
    _, _, session = run(result, {"command": "make"})
    assert (session.offsets, session.stderr_offsets) == ({"j7f3a": 10}, {"j7f3a": 5})
    runner = FakeRunner(
        check=[CheckResult(id="j7f3a", host="h1", running=True, offset=30, stderr_offset=9)]
    )
    PIPE.call("bash", {"check_pid": 12345}, runner, session)
    assert runner.last().request == CheckRequest(id="j7f3a", offset=10, stderr_offset=5)
    assert (session.offsets, session.stderr_offsets) == ({"j7f3a": 30}, {"j7f3a": 9})
    PIPE.call("bash", {"kill_pid": 12345}, runner, session)
    assert runner.last() == FakeCall(KillRequest(id="j7f3a", offset=30))


def test_check_running_reads_new_output_from_the_last_offset() -> None:
    session = _session_with_job()
    runner = FakeRunner(
        check=[
            CheckResult(
                id="j7f3a",
                host="h1",
                running=True,
                output="l1\nl2\n",
                offset=100,
                output_truncation=tail(2, 2),
                output_path="/spill/c1.out",
            ),
            CheckResult(
                id="j7f3a",
                host="h1",
                running=True,
                output="",
                offset=100,
                output_path="/spill/c1.out",
            ),
        ]
    )
    first = PIPE.call("bash", {"check_pid": 12345}, runner, session)
    assert first == ToolText(
        "[Process 12345 still running.\n\n"
        "New output since last check (2 lines):\nl1\nl2\n\n"
        "Full output: /spill/c1.out]"
    )
    assert runner.last().target == "j7f3a" and runner.last().options["offset"] == 0
    assert session.offsets == {"j7f3a": 100}
    second = PIPE.call("bash", {"check_pid": 12345}, runner, session)
    assert runner.last().options["offset"] == 100
    assert second.text == (
        "[Process 12345 still running.\n\nNo new output since last check.\n\n"
        "Full output: /spill/c1.out]"
    )


def test_check_running_cut_stderr_and_note() -> None:
    runner = FakeRunner(
        check=[
            CheckResult(
                id="j7f3a",
                host="h1",
                running=True,
                output="z\n",
                output_truncation=tail(8500, 2000),
                stderr_output="oops\n",
                output_path="/spill/c1.out",
                note="100 older bytes not shown",
            )
        ]
    )
    answer = PIPE.call("bash", {"check_pid": 12345}, runner, _session_with_job())
    assert answer.text == (
        "[Process 12345 still running.\n\n"
        "New output since last check (8500 lines, showing last 2000):\nz\n\n"
        "stderr:\noops\n\n"
        "Note: 100 older bytes not shown\n\n"
        "Full output: /spill/c1.out\nFull stderr: /spill/c1.err]"
    )


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (
            CheckResult(
                id="j7f3a",
                host="h1",
                running=False,
                exit_code=0,
                output="done\n",
                output_path="/spill/c1.out",
            ),
            "[Process 12345 exited with code 0.\n\nstdout:\ndone\n\nstderr:\n\n\n"
            "Full output: /spill/c1.out]",
        ),
        (
            CheckResult(
                id="j7f3a",
                host="h1",
                running=False,
                exit_code=1,
                output="t\n",
                output_truncation=tail(8500, 2000),
                output_path="/spill/c1.out",
            ),
            "[Process 12345 exited with code 1.\n\nstdout (last 2000 of 8500 lines):\nt\n\n"
            "stderr:\n\n\nFull output: /spill/c1.out]",
        ),
        (
            CheckResult(id="j7f3a", host="h1", running=False, signal=9, output_path="/o"),
            "[Process 12345 was killed by SIGKILL.\n\nstdout:\n\n\nstderr:\n\n\nFull output: /o]",
        ),
        (
            CheckResult(
                id="j7f3a", host="h1", running=False, output_path="/o", note="exit status unknown"
            ),
            "[Process 12345 ended (exit status unknown).\n\nstdout:\n\n\nstderr:\n\n\n"
            "Note: exit status unknown\n\nFull output: /o]",
        ),
    ],
)
def test_check_finished(result: CheckResult, text: str) -> None:
    answer = PIPE.call(
        "bash", {"check_pid": 12345}, FakeRunner(check=[result]), _session_with_job()
    )
    assert answer == ToolText(text)


@pytest.mark.parametrize(
    ("result", "head", "is_error"),
    [
        (
            CheckResult(id="j7f3a", host="h1", running=False, signal=15, output_path="/o"),
            "Process 12345 killed (SIGTERM).",
            False,
        ),
        (
            CheckResult(id="j7f3a", host="h1", running=False, exit_code=0, output_path="/o"),
            "Process 12345 ended with exit code 0.",
            False,
        ),
        (
            CheckResult(id="j7f3a", host="h1", running=False, output_path="/o"),
            "Process 12345 killed.",
            False,
        ),
        (
            CheckResult(id="j7f3a", host="h1", running=True, output_path="/o"),
            "Process 12345 is still running after the kill.",
            True,
        ),
    ],
)
def test_kill(result: CheckResult, head: str, is_error: bool) -> None:
    session = _session_with_job()
    runner = FakeRunner(kill=[result.model_copy(update={"output": "bye\n", "offset": 9})])
    answer = PIPE.call("bash", {"kill_pid": 12345}, runner, session)
    assert answer == ToolText(
        f"[{head}\n\nstdout:\nbye\n\nstderr:\n\n\nFull output: /o]", is_error=is_error
    )
    assert runner.last().method == "kill" and runner.last().target == "j7f3a"
    assert session.jobs["j7f3a"].killed is not is_error
    assert session.offsets["j7f3a"] == 9


def test_unknown_pid_is_a_clear_error() -> None:
    runner = FakeRunner()
    answer = PIPE.call("bash", {"check_pid": 999}, runner, _session_with_job())
    assert answer == ToolText(
        "Error: no backgrounded process with pid 999 in this session (known pids: 12345)", True
    )
    answer = PIPE.call("bash", {"kill_pid": 1}, runner, SessionState())
    assert answer.text.endswith("(known pids: none)")
    assert runner.calls == []


# ---------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "give exactly one of command, check_pid or kill_pid (got none of them)"),
        ({"timeout": 5}, "give exactly one of command, check_pid or kill_pid (got none of them)"),
        (
            {"command": "ls", "check_pid": 1},
            "give exactly one of command, check_pid or kill_pid (got command and check_pid)",
        ),
        (
            {"check_pid": 1, "kill_pid": 1},
            "give exactly one of command, check_pid or kill_pid (got check_pid and kill_pid)",
        ),
        (
            {"check_pid": 1, "timeout": 5},
            "timeout applies only to command, not to check_pid or kill_pid",
        ),
        ({"command": "ls", "timeout": 0}, "timeout must be between 1 and 86400000 ms, not 0"),
        (
            {"command": "ls", "timeout": 86400001},
            "timeout must be between 1 and 86400000 ms, not 86400001",
        ),
        (
            {"command": "ls", "timeout": "5"},
            "parameter 'timeout' must be an integer, not a string ('5')",
        ),
        ({"command": 5}, "parameter 'command' must be a string, not a number (5)"),
        ({"command": "  "}, "command is empty"),
        (
            {"command": "ls", "cwd": "/"},
            "unknown parameter 'cwd' (bash takes: command, timeout, check_pid, kill_pid)",
        ),
        (
            {"check_pid": "12345"},
            "parameter 'check_pid' must be an integer, not a string ('12345')",
        ),
    ],
)
def test_bad_arguments(args: dict[str, object], message: str) -> None:
    runner = FakeRunner()
    assert PIPE.call("bash", args, runner, SessionState()) == ToolText(f"Error: {message}", True)
    assert runner.calls == []


def test_nulls_do_not_count_as_given() -> None:
    answer, runner, _ = run(
        done(exit_code=0), {"command": "ls", "check_pid": None, "timeout": None}
    )
    assert not answer.is_error and runner.last().options["timeout"] == 120.0


def test_unknown_tool() -> None:
    answer = PIPE.call("Bash", {"command": "ls"}, FakeRunner(), SessionState())
    assert answer == ToolText("Error: unknown tool 'Bash'; the pipe dialect has: bash", True)


# -------------------------------------------------------------------------- property

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(["command", "timeout", "check_pid", "kill_pid"]) | st.text(max_size=6)


@given(
    tool=st.sampled_from(["bash"]) | st.text(max_size=6),
    args=st.dictionaries(keys, json_values, max_size=4) | json_values,
    pid=st.sampled_from([12345, 1, 0, -1]),
)
@settings(max_examples=400, deadline=None)  # a shared 2-core box: time is not the property
def test_any_arguments_give_a_tool_text(tool: str, args: object, pid: int) -> None:
    session = _session_with_job()
    if isinstance(args, dict) and "check_pid" in args:
        args["check_pid"] = pid
    answer = PIPE.call(tool, args, FakeRunner(), session)  # type: ignore[arg-type]
    assert isinstance(answer, ToolText) and isinstance(answer.text, str) and answer.text


def test_the_engines_completion_line_is_left_out() -> None:
    """The modes dialect's line at the end of every job file is not pipe's: the text says
    the end."""
    session = _session_with_job()
    ended = CheckResult(
        id="j7f3a",
        host="h1",
        running=False,
        exit_code=0,
        output="done\n\n\n[background process completed]\n",
        output_path="/spill/c1.out",
    )
    runner = FakeRunner(check=[ended], kill=[ended.model_copy(update={"signal": 15})])
    answer = PIPE.call("bash", {"check_pid": 12345}, runner, session)
    assert answer.text.startswith("[Process 12345 exited with code 0.\n\nstdout:\ndone\n\nstderr:")
    killed = PIPE.call("bash", {"kill_pid": 12345}, runner, session)
    assert "[background process" not in killed.text
