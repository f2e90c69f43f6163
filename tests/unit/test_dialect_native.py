"""The native dialect: bash, bash_check, bash_kill, bash_output, and every fact the engine
reports."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.dialects import NativeDialect, SessionState, ToolText, schemas
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.client.shells import ShellState
from bashfleet.worker.wire.control import (
    CheckRequest,
    KillRequest,
    ReadOutputRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    InputWait,
    JobHandle,
    OutputChunk,
    ProcessInfo,
    RunRequest,
    Spill,
    Stdin,
    SystemError_,
    TailLines,
    TruncationInfo,
)

NATIVE = NativeDialect()
JOB = JobHandle(id="j1", host="h2", pid=4242, pgid=4242, output_path="/jobs/j1.log")
HINT = "bash_check id=j1 shows its output; bash_kill id=j1 stops it."


def bash(
    result: CallResult | None = None,
    args: dict[str, object] | None = None,
    session: SessionState | None = None,
) -> tuple[ToolText, FakeRunner, SessionState]:
    runner = FakeRunner(run=[result] if result else [])
    session = session if session is not None else SessionState()
    answer = NATIVE.call("bash", args if args is not None else {"command": "make"}, runner, session)
    return answer, runner, session


def done(**fields: object) -> CallResult:
    fields.setdefault("duration_s", 0.5)
    return CallResult(call_id="c1", host="h1", **fields)


def tail(
    total: int,
    shown: int,
    total_bytes: int = 400000,
    shown_bytes: int = 51200,
    limit: str = "lines",
) -> TruncationInfo:
    return TruncationInfo(
        direction="tail",
        truncated=shown < total,
        limit=limit if shown < total else None,
        total_lines=total,
        total_bytes=total_bytes,
        shown_lines=shown,
        shown_bytes=shown_bytes,
        shown_ranges=((total - shown + 1, total),) if shown else (),
    )


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


# ---------------------------------------------------------------------- "already ran" hint


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run_at(
    dialect: NativeDialect, session: SessionState, result: CallResult, command: str = "make test"
) -> ToolText:
    return dialect.call("bash", {"command": command}, FakeRunner(run=[result]), session)


CUT_RUN = done(
    exit_code=2,
    stdout="FAILED\n",
    stdout_truncation=tail(8500, 2000),
    spill=Spill(host="h1", stdout_path="/spill/c1.out"),
)


def test_a_rerun_is_told_where_the_earlier_output_is() -> None:
    clock = Clock()
    native, session = NativeDialect(clock=clock), SessionState()
    first = run_at(native, session, CUT_RUN)
    assert "already" not in first.text and "same command" not in first.text
    clock.now += 125
    again = done(exit_code=2, stdout="FAILED\n").model_copy(update={"call_id": "c2"})
    answer = run_at(native, session, again)
    assert answer.text.endswith(
        "\n\nnote: the same command ran in this session 2m 5s ago, as call c1 on host h1 "
        "(exit code 2); its full output: bash_output id=c1 (/spill/c1.out on host h1)"
    )
    assert answer.is_error
    assert [(r.call_id, r.command, r.exit_code) for r in session.history] == [
        ("c1", "make test", 2),
        ("c2", "make test", 2),
    ]
    assert session.history[0].spill_path == "/spill/c1.out" and session.history[0].host == "h1"


@pytest.mark.parametrize(
    ("earlier", "ending"),
    [
        (CUT_RUN, "(exit code 2); its full output: bash_output id=c1 (/spill/c1.out on host h1)"),
        (
            done(timed_out=True, signal=9, spill=Spill(host="h1", stdout_path="/spill/c1.out")),
            "(killed by signal SIGKILL (9)); its full output: bash_output id=c1 "
            "(/spill/c1.out on host h1)",
        ),
        (
            done(timed_out=True, backgrounded=True, job=JOB),
            "(no exit status); it went on as job j1: bash_check id=j1",
        ),
    ],
)
def test_rerun_hint_says_how_the_earlier_run_ended(earlier: CallResult, ending: str) -> None:
    clock = Clock()
    native, session = NativeDialect(clock=clock), SessionState()
    run_at(native, session, earlier)
    clock.now += 42
    answer = run_at(native, session, done(exit_code=0, stdout="ok\n"))
    assert answer.text.endswith(
        f"note: the same command ran in this session 42s ago, as call c1 on host h1 {ending}"
    )


@pytest.mark.parametrize(
    "earlier", [done(exit_code=0, stdout="ok\n"), done(timed_out=True, signal=9)]
)
def test_no_rerun_note_when_the_earlier_output_was_shown_whole(earlier: CallResult) -> None:
    """`note: the same command ran in this session 0s ago` came on every rerun of
    `pytest` after an edit: nothing more to read there, so no note (tokens on every call)."""
    clock = Clock()
    native, session = NativeDialect(clock=clock), SessionState()
    run_at(native, session, earlier)
    clock.now += 0.2
    answer = run_at(native, session, done(exit_code=0, stdout="ok\n"))
    assert "note:" not in answer.text, answer.text


@pytest.mark.parametrize(
    ("result", "report"),
    [
        (done(exit_code=0, cwd="/w", cwd_after="/w/web"),
         "session s1: ended in /w/web; its next call starts there"),
        (done(exit_code=0, cwd="/w", cwd_after="/w", env_changes={"B": "1", "A": "2"}),
         "session s1: exported: A, B"),
        (done(exit_code=0, cwd="/w", cwd_after="/w", env_removed=("PAGER",)),
         "session s1: unset: PAGER"),
        (done(exit_code=0, cwd="/w", cwd_after="/x", env_removed=("PAGER",)),
         "session s1: ended in /x; its next call starts there; unset: PAGER"),
        # Nothing changed, nothing said.
        (done(exit_code=0, cwd="/w", cwd_after="/w"), None),
        (done(backgrounded=True, job=JOB), None),
    ],
)
def test_the_session_line_says_only_what_changed(result: CallResult, report: str | None) -> None:
    runner = FakeRunner(run=[result])
    answer = NATIVE.call("bash", {"command": "x", "session": "s1"}, runner, SessionState())
    if report is None:
        assert "session s1" not in answer.text
    else:
        assert answer.text.endswith(f"\n\n{report}"), answer.text


def test_no_hint_past_ten_minutes_or_for_another_command() -> None:
    clock = Clock()
    native, session = NativeDialect(clock=clock), SessionState()
    run_at(native, session, CUT_RUN)
    clock.now += 30
    assert "same command" not in run_at(native, session, done(exit_code=0), "make lint").text
    clock.now += 600
    assert "same command" not in run_at(native, session, done(exit_code=0)).text
    # Runs older than the window are forgotten.
    assert [r.command for r in session.history] == ["make lint", "make test"]


def test_a_call_that_never_ran_is_not_remembered() -> None:
    native, session = NativeDialect(clock=Clock()), SessionState()
    failed = done(error=SystemError_(kind="bad_cwd", message="Working directory does not exist"))
    run_at(native, session, failed)
    assert session.history == []
    assert "same command" not in run_at(native, session, done(exit_code=0)).text


def test_history_keeps_the_latest_runs() -> None:
    clock = Clock()
    native, session = NativeDialect(clock=clock), SessionState()
    for n in range(30):
        clock.now += 1
        run_at(native, session, done(exit_code=0), f"echo {n}")
    assert [r.command for r in session.history] == [f"echo {n}" for n in range(10, 30)]


def test_sessions_stored_before_the_history_load() -> None:
    stored = '{"cwd": null, "env": {}, "host": "h1", "jobs": {}, "pids": {}, "offsets": {}}'
    state = SessionState.model_validate_json(stored)
    assert (state.history, state.artifacts, state.fleet_session) == ([], {}, None)


# -------------------------------------------------------------------- named sessions


def test_a_named_session_is_a_fleet_session_that_carries_cwd_and_env() -> None:
    """The shell lives with the runner (the fleet: in Redis), not in this agent's state:
    another agent, or `bashfleet run --session s1`, shares it."""
    session = SessionState(cwd="/repo", env={"BASE": "1"}, host="mcp-pin")
    runner = FakeRunner(run=[
        done(exit_code=0, cwd="/home/w", cwd_after="/home/w/web",
             env_changes={"NODE_ENV": "test"}, env_removed=("LANG",)),
        done(exit_code=0, cwd="/home/w/web", cwd_after="/home/w/web"),
        done(exit_code=0, cwd="/x", cwd_after="/x"),
    ])
    first = NATIVE.call(
        "bash", {"command": "cd web; export NODE_ENV=test; unset LANG", "session": "s1"},
        runner, session,
    )
    # The agent's own pin is not the named session's; its cwd is where a fresh one starts.
    assert (runner.last().options["cwd"], runner.last().options["host"]) == ("/repo", None)
    assert runner.last().options["capture_state"] is True
    assert "\n\nsession s1: ended in /home/w/web; its next call starts there; " \
        "exported: NODE_ENV; unset: LANG" in first.text
    NATIVE.call("bash", {"command": "pwd", "session": "s1"}, runner, session)
    options = runner.last().options
    assert options["cwd"] == "/home/w/web"
    assert options["host"] == "h1"  # pinned where its first call ran
    assert options["env"] == {"NODE_ENV": "test", "BASE": "1"}
    assert options["unset_env"] == ("LANG",)
    # An explicit cwd holds for its call only; nothing changed, nothing is said.
    once = NATIVE.call("bash", {"command": "pwd", "session": "s1", "cwd": "/x"}, runner, session)
    assert runner.last().options["cwd"] == "/x"
    assert "session s1" not in once.text
    assert runner.shells["s1"].cwd == "/home/w/web"
    assert session.cwd == "/repo" and session.host == "mcp-pin"


def test_without_a_session_calls_are_stateless() -> None:
    session = SessionState(cwd="/repo", host="pinned")
    _, runner, _ = bash(done(exit_code=0, cwd_after="/elsewhere"), {"command": "pwd"}, session)
    options = runner.last().options
    assert (options["cwd"], options["host"], options["capture_state"]) == (
        "/repo", "pinned", False
    )
    assert runner.shells == {}


def test_a_named_session_that_learns_nothing_says_nothing() -> None:
    runner = FakeRunner(run=[done(backgrounded=True, job=JOB)])
    runner.shells["s1"] = ShellState(cwd="/w")
    answer = NATIVE.call(
        "bash", {"command": "serve", "mode": "background", "session": "s1"}, runner,
        SessionState(),
    )
    assert runner.last().options["capture_state"] is False  # a job ends after later calls
    assert runner.last().options["cwd"] == "/w"
    assert "session s1" not in answer.text  # only what changed is said
    assert runner.shells["s1"] == ShellState(cwd="/w", host="h1")


def test_a_bad_session_name_is_refused() -> None:
    answer, runner, _ = bash(None, {"command": "ls", "session": "no spaces"})
    assert answer.is_error and "session must be 1-64 letters" in answer.text
    assert runner.calls == []


# ----------------------------------------------------------------------- bash_output


def test_output_reads_kept_output_a_slice_at_a_time() -> None:
    runner = FakeRunner(read=[
        OutputChunk(path="/spill/c1.out", offset=0, next_offset=51200, size=90000,
                    text="a\nb\n", eof=False),
        OutputChunk(path="/spill/c1.err", offset=51200, next_offset=90000, size=90000,
                    text="z\n", eof=True),
    ])
    first = NATIVE.call("bash_output", {"id": "c1"}, runner, SessionState())
    assert runner.last().request == ReadOutputRequest(id="c1", offset=0, limit=51200)
    assert first == ToolText(
        "c1 stdout: bytes 0-51200 of 90000 (/spill/c1.out)\n\na\nb\n\n"
        "next: bash_output id=c1 offset=51200"
    )
    last = NATIVE.call(
        "bash_output", {"id": "c1", "offset": 51200, "stream": "stderr", "grep": "z"}, runner,
        SessionState(),
    )
    assert runner.last().request == ReadOutputRequest(
        id="c1", offset=51200, limit=51200, grep="z", stream="stderr"
    )
    assert last.text.endswith("lines matching 'z' (/spill/c1.err)\n\nz\n\nend of the output")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"id": "c1", "offset": -1}, "parameter 'offset' must be at least 0, not -1"),
        ({"id": "c1", "grep": "("}, "grep is not a valid regular expression"),
        ({"id": "c1", "stream": "both"}, "parameter 'stream' must be one of"),
    ],
)
def test_output_refuses_bad_arguments(args: dict[str, object], message: str) -> None:
    runner = FakeRunner()
    answer = NATIVE.call("bash_output", args, runner, SessionState())
    assert answer.is_error and message in answer.text
    assert runner.calls == []


def test_kill_counts_the_lines_it_shows() -> None:
    """The engine's completion line is not output: the count leaves it out too."""
    lines = "".join(f"{n}\n" for n in range(17))
    output = lines + "\n\n[background process failed: signal: 15 (SIGTERM)]\n"
    info = TruncationInfo(
        direction="tail", truncated=False, limit=None, total_lines=20,
        total_bytes=len(output), shown_lines=20, shown_bytes=len(output),
        shown_ranges=((1, 20),),
    )
    runner = FakeRunner(kill=[CheckResult(id="j1", host="h2", running=False, signal=15,
                                          output=output, output_truncation=info)])
    answer = NATIVE.call("bash_kill", {"id": "j1"}, runner, SessionState())
    assert "final output (17 lines):\n0\n1\n" in answer.text
    assert answer.text.endswith("\n16")


def test_the_engines_completion_line_is_left_out() -> None:
    failed = "x\n\n\n[background process failed: exit status: 3]\n"
    runner = FakeRunner(
        check=[CheckResult(id="j1", host="h2", running=False, exit_code=3, output=failed)],
        kill=[CheckResult(id="j1", host="h2", running=False, signal=15, output=failed)],
    )
    answer = NATIVE.call("bash_check", {"id": "j1"}, runner, SessionState())
    assert answer.text.startswith(
        "job j1 on host h2: exited with code 3\n\noutput since byte 0 (1 line):\nx\n\nnext"
    )
    killed = NATIVE.call("bash_kill", {"id": "j1"}, runner, SessionState())
    assert "[background process" not in killed.text
    # Only the engine's own line at the very end goes.
    kept = "[background process completed] is what I print\n"
    runner = FakeRunner(check=[CheckResult(id="j1", host="h2", running=True, output=kept)])
    assert kept.strip() in NATIVE.call("bash_check", {"id": "j1"}, runner, SessionState()).text


# ------------------------------------------------------------------- interactive (bash_write)


def _session_handle(stdin: Stdin = "pty") -> JobHandle:
    return JobHandle(id="j1", host="h1", pid=7, pgid=7, output_path="/s/j1.log", stdin=stdin)


def test_bash_tty_waiting_for_input_and_bash_write() -> None:
    waiting = CallResult(
        call_id="c1", host="h1", backgrounded=True, combined=True, stdout="Name: ",
        job=_session_handle(),
        input_wait=InputWait(idle_s=2.0, prompt="Name: ", pid=8, command="bash"),
    )
    runner = FakeRunner(run=[waiting], write=[SessionOutput(
        id="j1", host="h1", running=False, exit_code=0, stdin="pty", output="bob\nhi bob\n",
        written=4)])
    state = SessionState()
    answer = NATIVE.call("bash", {"command": "read -p 'Name: ' n", "tty": True}, runner, state)
    assert answer.text.startswith(
        'running as job j1 on host h1 with a terminal; WAITING FOR INPUT (blocked reading it '
        'for 2.0s, pid 8) after printing: "Name: "')
    assert "bash_write id=j1 sends input" in answer.text and not answer.is_error
    request = runner.last().request
    assert getattr(request, "stdin", None) == "pty"
    written = NATIVE.call("bash_write", {"id": "j1", "input": "bob\n", "close": True}, runner,
                          state)
    assert written.text == ("job j1 on host h1: exited with code 0\n\nsent 4 bytes\n\n"
                            "new output:\nbob\nhi bob")
    sent = runner.last().request
    assert isinstance(sent, WriteStdinRequest) and sent.close and sent.data == "bob\n"


def test_bash_stdin_that_ends_within_its_wait_reads_as_a_call() -> None:
    ended = CallResult(call_id="c2", host="h1", exit_code=3, combined=True, stdout="x\n",
                       job=_session_handle("pipe"))
    answer = NATIVE.call("bash", {"command": "exit 3", "stdin": True},
                         FakeRunner(run=[ended]), SessionState())
    assert answer.text.startswith("exit code: 3\nhost h1") and answer.is_error
    assert "bash_check" not in answer.text and "bash_write" not in answer.text


def test_a_result_says_what_the_workspaces_network_policy_refused() -> None:
    answer, _, _ = bash(done(exit_code=7, stdout="", network_denied=(
        "pypi.example:443 (connect)", "203.0.113.9:22/tcp (address)")))
    assert answer.text.endswith(
        "network: this workspace's policy refused pypi.example:443 (connect), "
        "203.0.113.9:22/tcp (address)")
    assert "network:" not in bash(done(exit_code=0))[0].text
