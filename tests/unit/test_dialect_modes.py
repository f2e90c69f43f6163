"""The modes dialect: schema, description, policy, every result text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.dialects import ModesDialect, SessionState, ToolText, humanize_bytes, schemas
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.worker.wire.control import KillRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    JobHandle,
    Middle,
    Policy,
    ProcessInfo,
    Spill,
    SystemError_,
    TruncationInfo,
)

MODES = ModesDialect()

#: The modes tool's schema, verbatim.
SEED_SCHEMA = {
    "type": "object",
    "required": ["command"],
    "properties": {
        "command": {"type": "string", "description": "Shell command to execute via bash -c"},
        "mode": {
            "type": "string",
            "enum": ["default", "slow", "background"],
            "description": (
                "Execution mode: default (30s timeout), slow (15min timeout), background (detached)"
            ),
        },
    },
}

#: The modes tool's description template, verbatim, filled with /home/me/project.
SEED_DESCRIPTION = """Executes shell commands via bash -c, returning combined stdout/stderr.
Bash state changes (working dir, variables, aliases) don't persist between calls.

With mode="background", returns immediately with output redirected to a file.
Use background for servers/demos that need to stay running.

Use mode="slow" for potentially slow commands: builds, downloads,
installs, tests, or any other substantive operation.

IMPORTANT: Keep commands concise. The command input must be less than 60k tokens.
For complex scripts, write them to a file first and then execute the file.

<pwd>/home/me/project</pwd>"""


def call(
    result: CallResult,
    args: dict[str, object] | None = None,
    session: SessionState | None = None,
    dialect: ModesDialect = MODES,
) -> tuple[ToolText, FakeRunner, SessionState]:
    runner = FakeRunner(run=[result])
    session = session if session is not None else SessionState(cwd="/home/me/project")
    return (
        dialect.call("bash", args if args is not None else {"command": "make"}, runner, session),
        runner,
        session,
    )


def done(**fields: object) -> CallResult:
    return CallResult(call_id="c1", host="h1", combined=True, **fields)


def test_schema_and_description_are_the_seeds() -> None:
    assert schemas(MODES, cwd="/home/me/project") == [
        {"name": "bash", "description": SEED_DESCRIPTION, "input_schema": SEED_SCHEMA}
    ]
    assert MODES.tools()[0].description.endswith("\n\n<pwd>~</pwd>")


def test_policy() -> None:
    assert MODES.policy() == Policy(
        name="modes",
        streams="combined",
        truncation=Middle(max_bytes=131072, keep_bytes=4096),
        default_timeout_s=30.0,
        background_timeout_s=86400.0,
        on_timeout="kill",
        kill_grace_s=15.0,
    )


def test_options_shorten_the_seeds_values() -> None:
    """Tests watch a timeout or a job's end without waiting 30 seconds or a day."""
    policy = ModesDialect(default_timeout_s=1, background_timeout_s=2, kill_grace_s=0.5).policy()
    assert (policy.default_timeout_s, policy.background_timeout_s, policy.kill_grace_s) == (
        1,
        2,
        0.5,
    )
    answer, _, _ = call(done(timed_out=True, signal=15), dialect=ModesDialect(default_timeout_s=1))
    assert answer == ToolText("[command timed out after 1s]\n", True)


@pytest.mark.parametrize("mode", ["default", "slow", "background"])
def test_modes_reach_the_runner(mode: str) -> None:
    _, runner, _ = call(done(exit_code=0), {"command": "make", "mode": mode})
    options = runner.last().options
    assert options["mode"] == mode
    assert options["timeout"] is None  # the runner knows each mode's timeout
    assert options["cwd"] == "/home/me/project"
    assert options["policy"] == MODES.policy()


def test_mode_defaults_to_default() -> None:
    _, runner, _ = call(done(exit_code=0))
    assert runner.last().options["mode"] == "default"


HEAD = "h" * 4095 + "\n"
TAIL = "t" * 4095 + "\n"
MIDDLE_INFO = TruncationInfo(
    direction="middle",
    truncated=True,
    limit="bytes",
    total_lines=5000,
    total_bytes=300000,
    shown_lines=2,
    shown_bytes=8192,
    shown_ranges=((1, 1), (5000, 5000)),
)


@pytest.mark.parametrize(
    ("result", "text", "is_error"),
    [
        (done(exit_code=0, stdout="hi\n"), "hi\n", False),
        (done(exit_code=0, stdout=""), "", False),
        (done(exit_code=2, stdout="boom\n"), "[command failed: exit code 2]\nboom\n", True),
        (done(signal=11, stdout=""), "[command failed: exit code -1 (killed by SIGSEGV)]\n", True),
        (
            done(
                exit_code=0,
                stdout=HEAD + "\n\n[snip]\n\n" + TAIL,
                stdout_truncation=MIDDLE_INFO,
                spill=Spill(host="h1", stdout_path="/spill/c1.log", stdout_bytes=300000),
            ),
            "[output truncated in middle: got 293kB, max is 128kB]\n"
            + HEAD
            + "\n\n[snip]\n\n"
            + TAIL
            + "\n\n[full output: /spill/c1.log on host h1 (300000 bytes, 5000 lines)]",
            False,
        ),
        (
            done(
                exit_code=1,
                stdout=HEAD + "\n\n[snip]\n\n" + TAIL,
                stdout_truncation=MIDDLE_INFO,
                spill=Spill(host="h1", stdout_path="/spill/c1.log", error="disk full"),
            ),
            "[command failed: exit code 1]\n[output truncated in middle: got 293kB, max is 128kB]\n"
            + HEAD
            + "\n\n[snip]\n\n"
            + TAIL
            + "\n\n[full output may be incomplete: /spill/c1.log on host h1 (disk full)]",
            True,
        ),
        (
            done(exit_code=0, stdout="x", stdout_truncation=MIDDLE_INFO),
            "[output truncated in middle: got 293kB, max is 128kB]\nx\n\n"
            "[full output (300000 bytes, 5000 lines) was not kept]",
            False,
        ),
        (
            done(timed_out=True, signal=15, stdout="partial\n"),
            "[command timed out after 30s]\npartial\n",
            True,
        ),
        (
            done(
                timed_out=True,
                signal=9,
                stdout="p\n",
                error=SystemError_(kind="internal", message="1 process(es) survived the kill: [7]"),
            ),
            "[command timed out after 30s]\np\n\n[warning: 1 process(es) survived the kill: [7]]",
            True,
        ),
    ],
)
def test_default_mode_texts(result: CallResult, text: str, is_error: bool) -> None:
    answer, _, _ = call(result)
    assert answer == ToolText(text, is_error=is_error)


def test_slow_timeout_text() -> None:
    answer, _, _ = call(
        done(timed_out=True, signal=15, stdout="building\n"), {"command": "make", "mode": "slow"}
    )
    assert answer == ToolText("[command timed out after 900s]\nbuilding\n", True)


SLEEPER = ProcessInfo(pid=4242, state="sleeping", cpu_s=0.04, command="sleep 300")
BUILD = ProcessInfo(pid=4243, state="running", cpu_s=29.51, command="cc -O2 big.c")


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (
            done(
                timed_out=True,
                signal=15,
                stdout="building\n",
                processes=(SLEEPER, BUILD),
                last_output_age_s=12.34,
            ),
            "[command timed out after 30s]\nbuilding\n"
            "[processes at the timeout, now killed:\n"
            "  pid 4242 sleeping, 0.0s CPU: sleep 300\n"
            "  pid 4243 running, 29.5s CPU: cc -O2 big.c\n"
            "last output 12.3s ago]",
        ),
        (
            done(timed_out=True, signal=15, processes=(SLEEPER,)),
            "[command timed out after 30s]\n"
            "[processes at the timeout, now killed:\n"
            "  pid 4242 sleeping, 0.0s CPU: sleep 300\n"
            "no output yet]",
        ),
        (
            done(timed_out=True, signal=15, stdout="no newline", last_output_age_s=0.5),
            "[command timed out after 30s]\nno newline\n[last output 0.5s ago]",
        ),
        (
            done(
                timed_out=True,
                signal=9,
                stdout="p\n",
                processes=(SLEEPER,),
                last_output_age_s=3,
                error=SystemError_(kind="internal", message="1 process(es) survived the kill: [7]"),
            ),
            "[command timed out after 30s]\np\n\n[warning: 1 process(es) survived the kill: [7]]\n"
            "[processes at the timeout, now killed:\n"
            "  pid 4242 sleeping, 0.0s CPU: sleep 300\n"
            "last output 3.0s ago]",
        ),
    ],
)
def test_timeout_lists_what_the_call_was_doing(result: CallResult, text: str) -> None:
    """After the timeout text, the processes it killed and how long ago it last printed."""
    answer, _, _ = call(result)
    assert answer == ToolText(text, True)


def test_activity_only_on_a_timeout() -> None:
    answer, _, _ = call(done(exit_code=0, stdout="ok\n", processes=(SLEEPER,)))
    assert answer == ToolText("ok\n")


def test_background_start_pins_the_host() -> None:
    job = JobHandle(id="j1", host="h2", pid=4242, pgid=4242, output_path="/jobs/j1.log")
    answer, runner, session = call(
        done(backgrounded=True, job=job), {"command": "python -m http.server", "mode": "background"}
    )
    assert answer == ToolText(
        "<pid>4242</pid>\n<output_file>/jobs/j1.log</output_file>\n"
        "<reminder>To stop: kill -9 -4242</reminder>"
    )
    assert session.host == "h2"
    assert session.jobs["j1"].command == "python -m http.server"
    # Later calls (cat the output file) go to the job's host.
    _, runner, _ = call(done(exit_code=0), {"command": "cat /jobs/j1.log"}, session)
    assert runner.last().options["host"] == "h2"


def test_background_keeps_an_already_pinned_host() -> None:
    job = JobHandle(id="j1", host="h2", pid=1, pgid=1, output_path="/o")
    _, _, session = call(
        done(backgrounded=True, job=job),
        {"command": "x", "mode": "background"},
        SessionState(host="h1"),
    )
    assert session.host == "h1"


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (
            SystemError_(kind="bad_cwd", message="Working directory does not exist: /gone"),
            "[system error: Working directory does not exist: /gone]",
        ),
        (
            SystemError_(kind="spawn_failed", message="could not start bash: ENOMEM"),
            "[system error: could not start bash: ENOMEM]",
        ),
    ],
)
def test_system_errors_are_not_command_failures(error: SystemError_, text: str) -> None:
    answer, _, _ = call(done(error=error))
    assert answer == ToolText(text, True)
    assert not answer.text.startswith("[command failed")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "missing required parameter 'command'"),
        ({"mode": "slow"}, "missing required parameter 'command'"),
        (
            {"command": "ls", "mode": "fast"},
            "parameter 'mode' must be one of 'default', 'slow', 'background', not 'fast'",
        ),
        (
            {"command": "ls", "timeout": 5},
            "unknown parameter 'timeout' (bash takes: command, mode)",
        ),
        ({"command": "ls", "mode": 1}, "parameter 'mode' must be a string, not a number (1)"),
        ({"command": ""}, "command is empty"),
    ],
)
def test_bad_arguments(args: dict[str, object], message: str) -> None:
    runner = FakeRunner()
    assert MODES.call("bash", args, runner, SessionState()) == ToolText(
        f"[invalid input: {message}]", True
    )
    assert runner.calls == []


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (4095, "4095B"),
        (4096, "4kB"),
        (4607, "4kB"),
        (4608, "5kB"),
        (131072, "128kB"),
        (300000, "293kB"),
        (1024 * 1024 - 1, "1024kB"),
        (1024 * 1024, "1MB"),
        (1536 * 1024, "2MB"),
        (1024**3 - 1, "1024MB"),
        (1024**3, "more than 1GB"),
    ],
)
def test_humanize_bytes(size: int, text: str) -> None:
    assert humanize_bytes(size) == text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(["command", "mode"]) | st.text(max_size=6)


@given(
    tool=st.sampled_from(["bash"]) | st.text(max_size=6),
    args=st.dictionaries(
        keys, json_values | st.sampled_from(["default", "slow", "background"]), max_size=3
    )
    | json_values,
)
@settings(max_examples=400, deadline=None)  # a shared 2-core box: time is not the property
def test_any_arguments_give_a_tool_text(tool: str, args: object) -> None:
    answer = MODES.call(tool, args, FakeRunner(), SessionState())  # type: ignore[arg-type]
    assert isinstance(answer, ToolText) and isinstance(answer.text, str)


def _session_with_job() -> tuple[SessionState, JobHandle]:
    job = JobHandle(id="j7", host="h2", pid=4242, pgid=4242, output_path="/jobs/j7.log")
    session = SessionState()
    session.remember(job, "python3 -m http.server")
    return session, job


@pytest.mark.parametrize("command", ["kill -9 -4242", "kill -4242", "kill -TERM 4242 ;",
                                     "  kill -SIGKILL -4242  "])
def test_the_reminders_kill_of_a_session_job_goes_through_the_fleet(command: str) -> None:
    # Each call runs in a PID namespace of its own: a later call's `kill -9 -<pgid>`
    # could not reach the job, so the tool's reminder is carried out by the fleet.
    session, job = _session_with_job()
    runner = FakeRunner(check=[CheckResult(id="j7", host="h2", running=True)])
    answer = MODES.call("bash", {"command": command}, runner, session)
    assert answer == ToolText("")
    assert [c.method for c in runner.calls] == ["check", "kill"]
    signal = 9 if "9" in command or "KILL" in command else 15
    assert runner.last().request == KillRequest(id=job.id, signal=signal)


def test_killing_an_ended_job_fails_as_bash_would() -> None:
    session, _ = _session_with_job()
    runner = FakeRunner(check=[CheckResult(id="j7", host="h2", running=False, exit_code=0)])
    answer = MODES.call("bash", {"command": "kill -9 -4242"}, runner, session)
    assert answer == ToolText(
        "[command failed: exit code 1]\nbash: line 1: kill: (-4242) - No such process",
        is_error=True,
    )
    assert [c.method for c in runner.calls] == ["check"]


@pytest.mark.parametrize("command", ["kill -9 -999", "kill -9 -4242; echo done", "pkill x"])
def test_other_kills_run_as_commands(command: str) -> None:
    session, _ = _session_with_job()
    runner = FakeRunner()
    MODES.call("bash", {"command": command}, runner, session)
    assert [c.method for c in runner.calls] == ["run"]
