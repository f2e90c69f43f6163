"""The native dialect across calls: the "already ran" hint, named sessions, bash_output,
interactive sessions (bash_write) and what a workspace's network refused."""

from __future__ import annotations

import pytest

from bashfleet.client.dialects import NativeDialect, SessionState, ToolText
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.client.shells import ShellState
from bashfleet.worker.wire.control import ReadOutputRequest, SessionOutput, WriteStdinRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    InputWait,
    JobHandle,
    OutputChunk,
    Spill,
    Stdin,
    SystemError_,
    TruncationInfo,
)

from .native_helpers import JOB, NATIVE, bash, done, tail

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
