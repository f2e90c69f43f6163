"""The claude dialect: Bash, BashOutput, KillBash, limits and every result text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.dialects import ClaudeDialect, SessionState, ToolText, schemas
from bashfleet.client.dialects.claude import EMPTY_OUTPUT, format_duration
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.client.shells import ShellState
from bashfleet.worker.wire.control import CheckRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CharCap,
    CheckResult,
    JobHandle,
    ProcessInfo,
    Spill,
    SystemError_,
    TruncationInfo,
)

CLAUDE = ClaudeDialect()
JOB = JobHandle(id="j5c2", host="h1", pid=777, pgid=777, output_path="/jobs/j5c2.log")


def bash(
    result: CallResult | None = None,
    args: dict[str, object] | None = None,
    session: SessionState | None = None,
) -> tuple[ToolText, FakeRunner, SessionState]:
    runner = FakeRunner(run=[result] if result else [])
    session = session if session is not None else SessionState(cwd="/repo")
    answer = CLAUDE.call("Bash", args if args is not None else {"command": "make"}, runner, session)
    return answer, runner, session


def done(**fields: object) -> CallResult:
    return CallResult(call_id="c1", host="h1", combined=True, **fields)


def with_job(command: str = "npm run dev") -> SessionState:
    session = SessionState()
    session.remember(JOB, command)
    return session


# ------------------------------------------------------------------------ schema/policy


def test_tools_and_schemas() -> None:
    tools = {tool["name"]: tool["input_schema"] for tool in schemas(CLAUDE)}
    assert list(tools) == ["Bash", "BashOutput", "KillBash"]
    assert tools["Bash"]["required"] == ["command"]
    assert set(tools["Bash"]["properties"]) == {
        "command",
        "timeout",
        "description",
        "run_in_background",
    }
    assert tools["Bash"]["properties"]["timeout"] == {
        "type": "number",
        "description": "Optional timeout in milliseconds (max 600000)",
    }
    assert tools["Bash"]["properties"]["run_in_background"]["type"] == "boolean"
    assert tools["BashOutput"]["required"] == ["bash_id"]
    assert set(tools["BashOutput"]["properties"]) == {"bash_id", "filter"}
    assert tools["KillBash"]["required"] == ["bash_id"]
    assert set(tools["KillBash"]["properties"]) == {"bash_id"}


def test_policy() -> None:
    policy = CLAUDE.policy()
    assert policy.name == "claude"
    assert policy.streams == "combined"
    assert policy.truncation == CharCap(max_chars=30000)
    assert (policy.default_timeout_s, policy.max_timeout_s) == (120.0, 600.0)
    assert policy.on_timeout == "kill"


# ------------------------------------------------------------------------------- Bash


@pytest.mark.parametrize(("timeout", "sent"), [(None, 120.0), (600000, 600.0), (1500, 1.5)])
def test_timeout_in_milliseconds(timeout: float | None, sent: float) -> None:
    _, runner, _ = bash(done(exit_code=0), {"command": "make", "timeout": timeout})
    assert runner.last().options["timeout"] == sent
    assert runner.last().options["mode"] == "default"


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (
            600001,
            "timeout 600001 ms is above the maximum of 600000 ms (10 minutes); "
            "use run_in_background for longer commands",
        ),
        (
            3.6e6,
            "timeout 3600000 ms is above the maximum of 600000 ms (10 minutes); "
            "use run_in_background for longer commands",
        ),
        (0, "timeout must be a positive number of milliseconds, not 0"),
        (-1, "timeout must be a positive number of milliseconds, not -1"),
        (-0.5, "timeout must be a positive number of milliseconds, not -0.5"),
        ("60000", "parameter 'timeout' must be a number, not a string ('60000')"),
    ],
)
def test_timeout_refusals(timeout: object, message: str) -> None:
    answer, runner, _ = bash(None, {"command": "make", "timeout": timeout})
    assert answer == ToolText(
        f"InputValidationError: Bash failed due to the following issue:\n{message}", True
    )
    assert runner.calls == []


def test_a_session_gets_its_shell_on_first_use_starting_in_its_cwd() -> None:
    session = SessionState(cwd="/repo", host="h1")
    runner = FakeRunner(run=[done(exit_code=0, cwd="/repo", cwd_after="/repo/web"),
                             done(exit_code=0)])
    CLAUDE.call("Bash", {"command": "cd web", "description": "Enter web"}, runner, session)
    assert session.fleet_session is not None and session.fleet_session.startswith("claude-")
    assert runner.last().options["cwd"] == "/repo"
    CLAUDE.call("Bash", {"command": "pwd"}, runner, session)
    assert runner.last().options["cwd"] == "/repo/web"
    assert runner.last().options["session"] == session.fleet_session
    assert session.cwd == "/repo"  # the agent's own cwd: where its shell started


def shell_session() -> SessionState:
    """An agent session whose calls share the fleet session `agent-1`'s shell."""
    return SessionState(fleet_session="agent-1")


def test_foreground_runs_capture_the_shell_state() -> None:
    session = shell_session()
    _, runner, _ = bash(done(exit_code=0), session=session)
    assert runner.last().options["capture_state"] is True
    assert runner.last().options["session"] == "agent-1"
    _, runner, _ = bash(
        done(backgrounded=True, job=JOB), {"command": "x", "run_in_background": True}, session
    )
    assert runner.last().options["capture_state"] is False  # a job ends after later calls ran


def test_exports_unsets_and_cd_carry_to_the_next_call() -> None:
    """The session behaves like one long-lived shell, kept by the fleet."""
    session = shell_session()
    runner = FakeRunner(run=[
        done(exit_code=0, cwd="/repo", cwd_after="/repo/web",
             env_changes={"NODE_ENV": "test", "TOKEN_PATH": "/t"}, env_removed=("DROP", "LANG")),
        done(exit_code=0),
    ])
    runner.shells["agent-1"] = ShellState(
        cwd="/repo", env={"KEEP": "1", "DROP": "2", "NODE_ENV": "dev"}
    )
    CLAUDE.call(
        "Bash", {"command": "cd web; export NODE_ENV=test TOKEN_PATH=/t; unset DROP LANG"},
        runner, session,
    )
    assert runner.last().options["cwd"] == "/repo"
    CLAUDE.call("Bash", {"command": "echo $NODE_ENV"}, runner, session)
    assert runner.last().options["env"] == {"KEEP": "1", "NODE_ENV": "test", "TOKEN_PATH": "/t"}
    assert runner.last().options["cwd"] == "/repo/web"
    assert runner.last().options["unset_env"] == ("DROP", "LANG")


def test_unset_worker_variables_stay_unset() -> None:
    """A variable the worker provides (not one the session set) stays unset once unset."""
    session = shell_session()
    runner = FakeRunner(run=[
        done(exit_code=0, env_removed=("LANG", "KEEP")),
        done(exit_code=0),
        done(backgrounded=True, job=JOB),
        done(exit_code=0, env_changes={"LANG": "C"}),
        done(exit_code=0),
    ])
    runner.shells["agent-1"] = ShellState(env={"KEEP": "1"})
    CLAUDE.call("Bash", {"command": "unset LANG KEEP"}, runner, session)
    CLAUDE.call("Bash", {"command": "echo ${LANG-none}"}, runner, session)
    assert runner.last().options["unset_env"] == ("LANG", "KEEP")
    assert runner.last().options["env"] == {}
    # Background runs start without it too.
    CLAUDE.call("Bash", {"command": "env", "run_in_background": True}, runner, session)
    assert runner.last().options["unset_env"] == ("LANG", "KEEP")
    # Exporting it again brings it back: no longer unset.
    CLAUDE.call("Bash", {"command": "export LANG=C"}, runner, session)
    CLAUDE.call("Bash", {"command": "true"}, runner, session)
    assert runner.last().options["unset_env"] == ("KEEP",)
    assert runner.last().options["env"] == {"LANG": "C"}


def test_concurrent_calls_never_lose_a_cd() -> None:
    """Three calls of a fresh session at once; the quick `cd /tmp` is kept although
    slower calls that did not `cd` end after it."""
    session = shell_session()
    runner = FakeRunner(run=[
        done(exit_code=0, cwd="/root", cwd_after="/tmp"),
        done(exit_code=0, cwd="/root", cwd_after="/root"),
        done(exit_code=0, cwd="/root", cwd_after="/root", env_changes={"B": "2"}),
    ])
    for command in ("cd /tmp", "sleep 1", "export B=2; sleep 2"):
        CLAUDE.call("Bash", {"command": command}, runner, session)
    assert runner.shells["agent-1"].cwd == "/tmp"
    assert runner.shells["agent-1"].env == {"B": "2"}


def test_nothing_unset_sends_no_unset_env() -> None:
    _, runner, _ = bash(done(exit_code=0))
    assert runner.last().options["unset_env"] == ()


PROCS = (
    ProcessInfo(pid=31, state="sleeping", cpu_s=0.0, command="bash -c npm test"),
    ProcessInfo(pid=32, state="running", cpu_s=4.56, command="node jest"),
)


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (
            done(
                timed_out=True,
                signal=15,
                stdout="PASS a\n",
                processes=PROCS,
                last_output_age_s=9.99,
            ),
            "Command timed out after 2m 0.0s\nPASS a\n"
            "Processes at the timeout, now killed:\n"
            "  pid 31 sleeping, 0.0s CPU: bash -c npm test\n"
            "  pid 32 running, 4.6s CPU: node jest\n"
            "Last output 10.0s ago.",
        ),
        (
            done(timed_out=True, signal=15, processes=PROCS[:1]),
            "Command timed out after 2m 0.0s\n"
            "Processes at the timeout, now killed:\n"
            "  pid 31 sleeping, 0.0s CPU: bash -c npm test\n"
            "No output yet.",
        ),
        (
            done(timed_out=True, signal=15, last_output_age_s=1.25),
            "Command timed out after 2m 0.0s\nLast output 1.2s ago.",
        ),
    ],
)
def test_timeout_lists_what_the_command_was_doing(result: CallResult, text: str) -> None:
    """After Claude Code's timeout text, the processes killed and the last output's age."""
    answer, _, _ = bash(result)
    assert answer == ToolText(text, True)


def test_a_failed_command_still_carries_its_state() -> None:
    session = shell_session()
    runner = FakeRunner(run=[done(exit_code=1, env_changes={"A": "1"})])
    answer = CLAUDE.call("Bash", {"command": "export A=1; false"}, runner, session)
    assert answer == ToolText("Exit code 1", True)
    assert runner.shells["agent-1"].env == {"A": "1"}


def test_no_captured_state_leaves_the_session_alone() -> None:
    session = shell_session()
    runner = FakeRunner(run=[
        done(exit_code=0),
        CallResult(call_id="c2", host="", error=SystemError_(kind="bad_cwd", message="gone")),
    ])
    runner.shells["agent-1"] = ShellState(cwd="/repo", env={"A": "1"}, host="h1")
    CLAUDE.call("Bash", {"command": "exec true"}, runner, session)
    CLAUDE.call("Bash", {"command": "ls"}, runner, session)
    assert runner.shells["agent-1"] == ShellState(cwd="/repo", env={"A": "1"}, host="h1")
    assert session == shell_session()


def char_cut(total_lines: int, shown_lines: int, partial: bool) -> TruncationInfo:
    return TruncationInfo(
        direction="head",
        truncated=True,
        limit="chars",
        total_lines=total_lines,
        total_bytes=90000,
        shown_lines=shown_lines,
        shown_bytes=30000,
        partial_line=partial,
        shown_ranges=((1, shown_lines),),
    )


@pytest.mark.parametrize(
    ("result", "text", "is_error"),
    [
        (done(exit_code=0, stdout="\n\n  \nhello\n  \n"), "hello", False),
        (done(exit_code=0, stdout="  indented\n"), "  indented", False),
        (done(exit_code=0, stdout=""), EMPTY_OUTPUT, False),
        (done(exit_code=0, stdout="\n\n"), EMPTY_OUTPUT, False),
        (
            done(exit_code=1, stdout="ls: cannot access 'x'\n"),
            "Exit code 1\nls: cannot access 'x'",
            True,
        ),
        (done(exit_code=1, stdout=""), "Exit code 1", True),
        (done(signal=9, stdout="k\n"), "Exit code 137\nk", True),
        (
            done(timed_out=True, signal=15, stdout="partial\n"),
            "Command timed out after 2m 0.0s\npartial",
            True,
        ),
        (done(timed_out=True, signal=15), "Command timed out after 2m 0.0s", True),
        (
            done(
                exit_code=0,
                stdout="a" * 10 + "\n",
                stdout_truncation=char_cut(100, 40, True),
                spill=Spill(host="h1", stdout_path="/spill/c1.log"),
            ),
            "a" * 10 + "\n\n... [61 lines truncated] ...\n\nFull output: /spill/c1.log on host h1",
            False,
        ),
        (
            done(exit_code=2, stdout="b\n", stdout_truncation=char_cut(100, 40, False)),
            "Exit code 2\nb\n\n... [60 lines truncated] ...",
            True,
        ),
        (
            done(
                timed_out=True,
                signal=9,
                stdout="p\n",
                error=SystemError_(kind="internal", message="1 process(es) survived the kill"),
            ),
            "Command timed out after 2m 0.0s\np\n1 process(es) survived the kill",
            True,
        ),
        (
            done(
                error=SystemError_(kind="bad_cwd", message="Working directory does not exist: /x")
            ),
            "Error: Working directory does not exist: /x",
            True,
        ),
    ],
)
def test_foreground_texts(result: CallResult, text: str, is_error: bool) -> None:
    answer, _, _ = bash(result)
    assert answer == ToolText(text, is_error=is_error)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (1500, "1.5s"),
        (45000, "45.0s"),
        (60000, "1m 0.0s"),
        (120000, "2m 0.0s"),
        (90500, "1m 30.5s"),
        (600000, "10m 0.0s"),
    ],
)
def test_format_duration(ms: float, text: str) -> None:
    assert format_duration(ms) == text


def test_timeout_text_follows_the_given_timeout() -> None:
    answer, _, _ = bash(done(timed_out=True, signal=15), {"command": "sleep 99", "timeout": 45000})
    assert answer.text == "Command timed out after 45.0s"


def test_background_returns_the_job_id() -> None:
    answer, runner, session = bash(
        done(backgrounded=True, job=JOB),
        {"command": "npm run dev", "run_in_background": True, "timeout": 5000},
    )
    assert answer == ToolText("Command running in background with ID: j5c2")
    assert runner.last().options["mode"] == "background"
    assert session.jobs["j5c2"].command == "npm run dev"


def test_background_start_failure() -> None:
    answer, _, session = bash(
        done(error=SystemError_(kind="spawn_failed", message="could not start the job")),
        {"command": "x", "run_in_background": True},
    )
    assert answer == ToolText("Error: could not start the job", True)
    assert session.jobs == {}
    answer, _, _ = bash(done(exit_code=0), {"command": "x", "run_in_background": True})
    assert answer == ToolText("Error: the job did not start", True)


# ------------------------------------------------------------------------- BashOutput


def test_bash_output_reads_incrementally() -> None:
    session = with_job()
    runner = FakeRunner(
        check=[
            CheckResult(id="j5c2", host="h1", running=True, output="ready\n", offset=6),
            CheckResult(id="j5c2", host="h1", running=True, offset=6),
        ]
    )
    first = CLAUDE.call("BashOutput", {"bash_id": "j5c2"}, runner, session)
    assert first == ToolText("<status>running</status>\n\n<stdout>\nready\n</stdout>")
    assert runner.last().request == CheckRequest(id=runner.last().target, offset=0)
    second = CLAUDE.call("BashOutput", {"bash_id": "j5c2"}, runner, session)
    assert second == ToolText("<status>running</status>")
    assert runner.last().request == CheckRequest(id=runner.last().target, offset=6)


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (
            CheckResult(id="j5c2", host="h1", running=False, exit_code=0, output="done\n"),
            "<status>completed</status>\n\n<exit_code>0</exit_code>\n\n<stdout>\ndone\n</stdout>",
        ),
        (
            CheckResult(id="j5c2", host="h1", running=False, exit_code=2, stderr_output="bad\n"),
            "<status>failed</status>\n\n<exit_code>2</exit_code>\n\n<stderr>\nbad\n</stderr>",
        ),
        (CheckResult(id="j5c2", host="h1", running=False, signal=15), "<status>killed</status>"),
        (
            CheckResult(id="j5c2", host="h1", running=False, signal=11),
            "<status>failed</status>\n\n<exit_code>139</exit_code>",
        ),
        (
            CheckResult(id="j5c2", host="h1", running=False, note="exit status unknown"),
            "<status>failed</status>\n\n<note>exit status unknown</note>",
        ),
        (
            CheckResult(
                id="j5c2",
                host="h1",
                running=True,
                output="end\n",
                output_path="/jobs/j5c2.log",
                output_truncation=TruncationInfo(
                    direction="tail",
                    truncated=True,
                    limit="lines",
                    total_lines=2500,
                    total_bytes=9000,
                    shown_lines=2000,
                    shown_bytes=7000,
                    shown_ranges=((501, 2500),),
                ),
            ),
            "<status>running</status>\n\n<stdout>\n... [500 lines truncated] ...\nend\n</stdout>"
            "\n\nFull output: /jobs/j5c2.log on host h1",
        ),
    ],
)
def test_bash_output_texts(result: CheckResult, text: str) -> None:
    answer = CLAUDE.call("BashOutput", {"bash_id": "j5c2"}, FakeRunner(check=[result]), with_job())
    assert answer == ToolText(text)


def test_bash_output_filter() -> None:
    runner = FakeRunner()
    CLAUDE.call("BashOutput", {"bash_id": "j5c2", "filter": "error|warn"}, runner, with_job())
    assert runner.last().options["grep"] == "error|warn"
    answer = CLAUDE.call("BashOutput", {"bash_id": "j5c2", "filter": "("}, runner, with_job())
    assert answer.is_error
    assert answer.text.startswith(
        "InputValidationError: BashOutput failed due to the following issue:\n"
        "filter is not a valid regular expression: "
    )


@pytest.mark.parametrize("tool", ["BashOutput", "KillBash"])
def test_unknown_or_expired_id(tool: str) -> None:
    runner = FakeRunner()
    answer = CLAUDE.call(tool, {"bash_id": "bash_9"}, runner, with_job())
    assert answer == ToolText("No shell found with ID: bash_9", True)
    assert runner.calls == []


def test_expired_job_on_the_fleet_is_an_error() -> None:
    runner = FakeRunner(error=LookupError("no such job: j5c2"))
    answer = CLAUDE.call("BashOutput", {"bash_id": "j5c2"}, runner, with_job())
    assert answer == ToolText("Error: LookupError: no such job: j5c2", True)


# --------------------------------------------------------------------------- KillBash


def test_kill_bash() -> None:
    session = with_job("npm run dev")
    runner = FakeRunner(
        check=[CheckResult(id="j5c2", host="h1", running=True)],
        kill=[CheckResult(id="j5c2", host="h1", running=False, signal=15)],
    )
    answer = CLAUDE.call("KillBash", {"bash_id": "j5c2"}, runner, session)
    assert answer == ToolText("Successfully killed shell: j5c2 (npm run dev)")
    assert [c.method for c in runner.calls] == ["check", "kill"]
    assert session.jobs["j5c2"].killed
    # BashOutput now reports it killed, and a second kill is refused without a fleet call.
    runner = FakeRunner(check=[CheckResult(id="j5c2", host="h1", running=False, exit_code=143)])
    assert CLAUDE.call("BashOutput", {"bash_id": "j5c2"}, runner, session).text == (
        "<status>killed</status>"
    )
    runner = FakeRunner()
    answer = CLAUDE.call("KillBash", {"bash_id": "j5c2"}, runner, session)
    assert answer == ToolText(
        "Shell j5c2 is not running, so cannot be killed (status: killed)", True
    )
    assert runner.calls == []


def test_kill_bash_on_a_finished_shell() -> None:
    runner = FakeRunner(check=[CheckResult(id="j5c2", host="h1", running=False, exit_code=0)])
    answer = CLAUDE.call("KillBash", {"bash_id": "j5c2"}, runner, with_job())
    assert answer == ToolText(
        "Shell j5c2 is not running, so cannot be killed (status: completed)", True
    )
    assert [c.method for c in runner.calls] == ["check"]


def test_kill_bash_that_fails() -> None:
    runner = FakeRunner(
        check=[CheckResult(id="j5c2", host="h1", running=True)],
        kill=[CheckResult(id="j5c2", host="h1", running=True, note="1 process(es) survived")],
    )
    session = with_job("npm run dev")
    answer = CLAUDE.call("KillBash", {"bash_id": "j5c2"}, runner, session)
    assert answer == ToolText(
        "Failed to kill shell: j5c2 (npm run dev): 1 process(es) survived", True
    )
    assert not session.jobs["j5c2"].killed


# ----------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("Bash", {}, "missing required parameter 'command'"),
        (
            "Bash",
            {"command": "ls", "run_in_background": "yes"},
            "parameter 'run_in_background' must be true or false, not a string ('yes')",
        ),
        (
            "Bash",
            {"command": "ls", "shell_id": "x"},
            "unknown parameter 'shell_id' (Bash takes: command, timeout, description, "
            "run_in_background)",
        ),
        ("BashOutput", {}, "missing required parameter 'bash_id'"),
        (
            "KillBash",
            {"shell_id": "j5c2"},
            "unknown parameter 'shell_id' (KillBash takes: bash_id)",
        ),
        ("KillBash", {"bash_id": 5}, "parameter 'bash_id' must be a string, not a number (5)"),
    ],
)
def test_bad_arguments(tool: str, args: dict[str, object], message: str) -> None:
    runner = FakeRunner()
    assert CLAUDE.call(tool, args, runner, with_job()) == ToolText(
        f"InputValidationError: {tool} failed due to the following issue:\n{message}", True
    )
    assert runner.calls == []


def test_unknown_tool() -> None:
    assert CLAUDE.call("bash", {"command": "ls"}, FakeRunner(), SessionState()) == ToolText(
        "Error: No such tool available: bash", True
    )


# --------------------------------------------------------------------------- property

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(
    ["command", "timeout", "description", "run_in_background", "bash_id", "filter"]
) | st.text(max_size=6)


@given(
    tool=st.sampled_from(["Bash", "BashOutput", "KillBash"]) | st.text(max_size=6),
    args=st.dictionaries(keys, json_values | st.just("j5c2"), max_size=4) | json_values,
)
@settings(max_examples=400, deadline=None)  # a shared 2-core box: time is not the property
def test_any_arguments_give_a_tool_text(tool: str, args: object) -> None:
    answer = CLAUDE.call(tool, args, FakeRunner(), with_job())  # type: ignore[arg-type]
    assert isinstance(answer, ToolText) and answer.text


def test_bash_output_leaves_out_the_engines_completion_line() -> None:
    session = with_job()
    runner = FakeRunner(
        check=[
            CheckResult(
                id="j5c2",
                host="h1",
                running=False,
                signal=9,
                output="ready\n\n\n[background process failed: signal: 9 (SIGKILL)]\n",
            )
        ]
    )
    answer = CLAUDE.call("BashOutput", {"bash_id": "j5c2"}, runner, session)
    assert answer == ToolText("<status>killed</status>\n\n<stdout>\nready\n</stdout>")


# ------------------------------------------------- TaskOutput / TaskStop (Claude Code today)


def test_the_names_claude_code_uses_today_are_answered_not_listed() -> None:
    assert [spec.name for spec in CLAUDE.tools()] == ["Bash", "BashOutput", "KillBash"]
    assert [spec.name for spec in CLAUDE.aliases()] == ["TaskOutput", "TaskStop"]


def test_task_output_waits_for_the_task_to_end() -> None:
    session = with_job("make")
    runner = FakeRunner(check=[
        CheckResult(id="j5c2", host="h1", running=True),                # still running
        CheckResult(id="j5c2", host="h1", running=False, exit_code=0),  # ended
        CheckResult(id="j5c2", host="h1", running=False, exit_code=0, output="built\n",
                    offset=6),
    ])
    answer = CLAUDE.call("TaskOutput", {"task_id": "j5c2", "timeout": 5000}, runner, session)
    assert answer == ToolText(
        "<retrieval_status>success</retrieval_status>\n\n<task_id>j5c2</task_id>\n\n"
        "<task_type>local_bash</task_type>\n\n<status>completed</status>\n\n"
        "<exit_code>0</exit_code>\n\n<output>\nbuilt\n</output>")
    polls, read = runner.calls[:2], runner.calls[2]
    assert all(call.options["truncation"] == CharCap(max_chars=1) for call in polls)
    assert read.request == CheckRequest(id="j5c2", offset=0)
    assert session.offsets["j5c2"] == 6   # the next BashOutput or TaskOutput reads on


@pytest.mark.parametrize(("args", "retrieval", "checks"), [
    ({"task_id": "j5c2", "block": False}, "not_ready", 1),
    ({"task_id": "j5c2", "timeout": 0}, "timeout", 2),
])
def test_task_output_of_a_running_task(args: dict[str, object], retrieval: str,
                                       checks: int) -> None:
    running = CheckResult(id="j5c2", host="h1", running=True, output="half\n", offset=5)
    runner = FakeRunner(check=[running] * checks)
    answer = CLAUDE.call("TaskOutput", args, runner, with_job())
    assert answer.text == (
        f"<retrieval_status>{retrieval}</retrieval_status>\n\n<task_id>j5c2</task_id>\n\n"
        "<task_type>local_bash</task_type>\n\n<status>running</status>\n\n"
        "<output>\nhalf\n</output>")
    assert len(runner.calls) == checks


@pytest.mark.parametrize(("tool", "args", "text"), [
    ("TaskOutput", {"task_id": "b77"}, "No task found with ID: b77"),
    ("TaskStop", {"task_id": "b77"}, "No task found with ID: b77"),
    ("TaskStop", {"shell_id": "b77"}, "No task found with ID: b77"),
])
def test_an_unknown_task(tool: str, args: dict[str, object], text: str) -> None:
    runner = FakeRunner()
    assert CLAUDE.call(tool, args, runner, with_job()) == ToolText(text, True)
    assert runner.calls == []


@pytest.mark.parametrize(("tool", "args", "message"), [
    ("TaskOutput", {"task_id": "j5c2", "timeout": 600_001},
     "timeout must be between 0 and 600000 ms, not 600001"),
    ("TaskOutput", {"task_id": "j5c2", "timeout": -1},
     "timeout must be between 0 and 600000 ms, not -1"),
    ("TaskOutput", {"block": True}, "missing required parameter 'task_id'"),
    ("TaskStop", {}, "missing required parameter 'task_id'"),
])
def test_task_tools_refuse_bad_arguments(tool: str, args: dict[str, object],
                                         message: str) -> None:
    answer = CLAUDE.call(tool, args, FakeRunner(), with_job())
    assert answer == ToolText(
        f"InputValidationError: {tool} failed due to the following issue:\n{message}", True)


def test_task_stop() -> None:
    session = with_job("npm run dev")
    runner = FakeRunner(check=[CheckResult(id="j5c2", host="h1", running=True)])
    answer = CLAUDE.call("TaskStop", {"task_id": "j5c2"}, runner, session)
    assert answer == ToolText("Successfully stopped task: j5c2 (npm run dev)")
    assert [c.method for c in runner.calls] == ["check", "kill"]
    assert session.jobs["j5c2"].killed
    again = CLAUDE.call("TaskStop", {"shell_id": "j5c2"}, FakeRunner(), session)
    assert again == ToolText("Task j5c2 is not running (status: killed)", True)
    output = CLAUDE.call("TaskOutput", {"task_id": "j5c2"}, FakeRunner(check=[
        CheckResult(id="j5c2", host="h1", running=False, signal=15)] * 2), session)
    assert "<retrieval_status>success</retrieval_status>" in output.text
    assert "<status>killed</status>" in output.text
