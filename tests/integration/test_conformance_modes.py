"""The `modes` dialect through the fleet: each behaviour of its tool, one test each.

Timeouts of 30 seconds, 15 minutes and 24 hours are checked as the policy's values;
their behaviour is watched with `ModesDialect(default_timeout_s=1, ...)`, the same
dialect with shorter values (its options exist for this), so the calls still go
through the dialect's own policy and text.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from bashfleet.client.dialects import SessionState, ToolText, get_dialect
from bashfleet.client.dialects.modes import ModesDialect
from bashfleet.worker.wire.models import SLOW_TIMEOUT_S

from .conformance_helpers import (
    PLAIN_VALUE,
    PLAIN_VAR,
    SECRET_VALUE,
    SECRET_VAR,
    Conformance,
    Elapsed,
    conform_fixture,  # noqa: F401 - the `conform` fixture
)

MODES = get_dialect("modes")
#: The modes dialect with a 1-second default timeout (the tool's own is 30 s).
QUICK = ModesDialect(default_timeout_s=1)


def bash(
    conform: Conformance, args: dict[str, object], session: SessionState,
    dialect: ModesDialect | None = None,
) -> ToolText:
    return conform.call(dialect or MODES, "bash", args, session)


# ------------------------------------------------------------------- schema, modes


def test_schema_is_command_and_mode(conform: Conformance) -> None:
    """`command` (required string), `mode` (optional enum default / slow / background)
    -- and nothing else: no `timeout` a model could shorten."""
    schema = MODES.tools()[0].input_schema
    assert schema["required"] == ["command"]
    assert list(schema["properties"]) == ["command", "mode"]
    assert schema["properties"]["mode"]["enum"] == ["default", "slow", "background"]
    marker = conform.workdir / f"{uuid.uuid4().hex}.ran"
    text = bash(conform, {"command": f"touch {marker}", "timeout": 1}, conform.session())
    assert text == ToolText(
        "[invalid input: unknown parameter 'timeout' (bash takes: command, mode)]", True
    )
    assert not marker.exists()


def test_description_shows_the_cwd_and_commands_run_there(conform: Conformance) -> None:
    """The description includes the current working directory, and the command runs
    via `bash -c` in that working directory."""
    session = conform.session()
    description = MODES.tools(session.cwd)[0].description
    assert description.endswith(f"\n\n<pwd>{conform.workdir}</pwd>")
    assert "Bash state changes (working dir, variables, aliases) don't persist" in description
    assert bash(conform, {"command": "pwd"}, session) == ToolText(f"{conform.workdir}\n")


def test_mode_timeouts_are_the_seeds(conform: Conformance) -> None:
    """Default mode: a 30-second timeout; slow mode: 15 minutes; mode omitted = default;
    background: 24 hours (as the tool's `execute_background`)."""
    policy = MODES.policy()
    assert (policy.default_timeout_s, policy.background_timeout_s) == (30.0, 24 * 3600.0)
    assert SLOW_TIMEOUT_S == 15 * 60.0
    # `slow` is not the default timeout: it outlives a 1-second default.
    text = bash(conform, {"command": "sleep 1.5; echo built", "mode": "slow"}, conform.session(),
                QUICK)
    assert text == ToolText("built\n")


# --------------------------------------------------------------------------- output


def test_combined_output_in_arrival_order(conform: Conformance) -> None:
    """stdout and stderr come back combined, in the order they were written."""
    text = bash(conform, {"command": "echo a; echo b >&2; echo c; echo d >&2"}, conform.session())
    assert text == ToolText("a\nb\nc\nd\n")


def test_output_up_to_128kb_is_shown_whole(conform: Conformance) -> None:
    """As `format_output`: output of at most MAX_OUTPUT_LENGTH (128 KB) is unchanged."""
    text = bash(conform, {"command": "seq 1 20000"}, conform.session())  # 108,894 bytes
    assert text == ToolText("".join(f"{n}\n" for n in range(1, 20001)))


def test_past_128kb_the_middle_is_cut_keeping_4kb_each_end(conform: Conformance) -> None:
    """Output past 128 KB has its middle cut, its first and last 4 KB kept, and says so
    with the `[output truncated in middle: ...]` header and `[snip]`."""
    full = "".join(f"{n}\n" for n in range(1, 40001))  # 228,894 bytes
    text = bash(conform, {"command": "seq 1 40000"}, conform.session())
    header = "[output truncated in middle: got 224kB, max is 128kB]\n"
    body = full[:4096] + "\n\n[snip]\n\n" + full[-4096:]
    assert text.text.startswith(header + body + "\n\n"), text.text[:200]
    trailer = text.text[len(header + body) + 2 :]
    found = re.fullmatch(r"\[full output: (\S+) on host conform \(228894 bytes, 40000 lines\)\]",
                         trailer)
    assert found is not None, trailer
    assert not text.is_error
    assert Path(found.group(1)).read_text() == full
    assert conform.read_all(conform.fleet.last.call_id) == full


def test_failure_includes_the_exit_code_and_output(conform: Conformance) -> None:
    """A failure: "[command failed: exit code N]" then the output."""
    text = bash(conform, {"command": "echo oops; echo why >&2; exit 3"}, conform.session())
    assert text == ToolText("[command failed: exit code 3]\noops\nwhy\n", is_error=True)


def test_a_system_error_is_not_a_command_failure(conform: Conformance) -> None:
    """A system error gets a descriptive error message, told apart from a failure of the
    command itself."""
    gone = conform.workdir / "no-such-dir"
    text = bash(conform, {"command": "true"}, conform.session(cwd=str(gone)))
    assert text == ToolText(f"[system error: Working directory does not exist: {gone}]", True)
    missing = bash(conform, {"command": "no-such-command-xyz"}, conform.session())
    assert missing.text.startswith("[command failed: exit code 127]\n")


# -------------------------------------------------------------------------- timeout


def test_timeout_kills_the_group_and_returns_partial_output(conform: Conformance) -> None:
    """A command past its timeout has its process group terminated, and the call returns
    its partial output under a timeout line, then what it was running, and when it last
    printed."""
    session = conform.session()
    with Elapsed() as took:
        text = bash(
            conform, {"command": "sleep 300 & echo child=$!; echo partial; wait"},
            session, QUICK,
        )
    assert took.seconds < 10
    found = re.fullmatch(
        r"\[command timed out after 1s\]\nchild=(\d+)\npartial\n"
        r"\[processes at the timeout, now killed:\n((?:  pid \d+ \w+, [\d.]+s CPU: .*\n)+)"
        r"last output \d+\.\ds ago\]",
        text.text,
    )
    assert found is not None and text.is_error, text.text
    child = int(found.group(1))
    assert f"  pid {child} " in found.group(2) and "sleep 300" in found.group(2)
    # The pids are the session workspace's, where the child is gone too.
    conform.wait_gone(session, [child])


def test_the_grace_period_lets_the_group_clean_up(conform: Conformance) -> None:
    """The entire process group is killed after a 15-second grace period for cleanup:
    SIGTERM first; a command that cleans up on it is not cut short."""
    assert MODES.policy().kill_grace_s == 15.0
    with Elapsed() as took:
        text = bash(
            conform, {"command": "trap 'echo cleaned up; exit 0' TERM; sleep 300 & wait"},
            conform.session(), QUICK,
        )
    assert text.text.startswith("[command timed out after 1s]\ncleaned up\n"), text.text
    assert took.seconds < 10, "the group ended at once: the grace is a limit, not a wait"


def test_sigkill_after_the_grace_period(conform: Conformance) -> None:
    """A group that ignores SIGTERM is killed once the grace period is over (here 1 s
    instead of 15 s)."""
    quick_grace = ModesDialect(default_timeout_s=1, kill_grace_s=1)
    session = conform.session()
    with Elapsed() as took:
        text = bash(
            conform, {"command": "trap '' TERM; echo stubborn; sleep 300"}, session,
            quick_grace,
        )
    assert text.text.startswith("[command timed out after 1s]\nstubborn\n"), text.text
    assert 1.9 <= took.seconds < 10, took.seconds
    pids = [int(p) for p in re.findall(r"  pid (\d+) ", text.text)]
    assert pids
    conform.wait_gone(session, pids)


# ----------------------------------------------------------------------- background


def start(conform: Conformance, command: str, session: SessionState,
          dialect: ModesDialect | None = None) -> tuple[int, Path]:
    """Start a background command; its pid and output file, from the dialect's text."""
    with Elapsed() as took:
        text = bash(conform, {"command": command, "mode": "background"}, session, dialect)
    found = re.fullmatch(
        r"<pid>(\d+)</pid>\n<output_file>(\S+)</output_file>\n"
        r"<reminder>To stop: kill -9 -(\d+)</reminder>",
        text.text,
    )
    assert found is not None and not text.is_error, text.text
    assert found.group(1) == found.group(3)
    assert took.seconds < 5, "background returns immediately"
    return int(found.group(1)), Path(found.group(2))


def test_background_returns_the_pid_and_output_file(conform: Conformance) -> None:
    """A background command starts detached and the call returns at once with its process
    ID and output file path; the file is on the host that runs the job, in the session
    workspace's output directory: the pid and the path are what the model's next call
    sees and reads."""
    session = conform.session()
    pid, output = start(conform, "echo serving; echo oops >&2; sleep 300", session)
    assert conform.alive(session, pid)
    assert output.is_relative_to(conform.out_dir(session))
    conform.wait_file(session, output, "oops\n")
    assert conform.read_in_workspace(session, output) == "serving\noops\n"
    assert output.read_text() == "serving\noops\n"
    assert session.host == "conform"
    bash(conform, {"command": f"kill -9 -{pid}"}, session)
    conform.wait_gone(session, [pid])


def test_completion_status_is_appended_to_the_output_file(conform: Conformance) -> None:
    """A background process's completion status is appended to its output file
    (`[background process completed]` / `failed: ...`)."""
    session = conform.session()
    _, ok = start(conform, "echo finished", session)
    assert conform.wait_file(session, ok, "[background process") \
        == "finished\n\n\n[background process completed]\n"
    _, failed = start(conform, "echo broke; exit 3", session)
    assert (
        conform.wait_file(session, failed, "[background process")
        == "broke\n\n\n[background process failed: exit status: 3]\n"
    )


def test_kill_9_pgid_stops_the_background_job(conform: Conformance) -> None:
    """The process group ID is given for termination via `kill -9 -<pgid>`."""
    session = conform.session()
    pid, output = start(conform, "sleep 300 & echo child=$!; wait", session)
    seen = conform.wait_file(session, output, "child=")
    child = int(re.search(r"child=(\d+)", seen).group(1))  # type: ignore[union-attr]
    assert conform.alive(session, child)
    # The model's next call, as the reminder says: the pgid is the workspace's.
    assert bash(conform, {"command": f"kill -9 -{pid}"}, session) == ToolText("")
    conform.wait_gone(session, [pid, child])
    assert conform.wait_file(session, output, "[background process").endswith(
        "\n\n[background process failed: signal: 9 (SIGKILL)]\n"
    )


def test_background_jobs_end_after_their_timeout(conform: Conformance) -> None:
    """Mode semantics: `background` -- "24 hours" timeout, then the job is ended (here
    after 1 s)."""
    session = conform.session()
    pid, output = start(conform, "echo up; sleep 300", session,
                        ModesDialect(background_timeout_s=1))
    assert conform.wait_file(session, output, "[background process").startswith("up\n")
    conform.wait_gone(session, [pid])


# ------------------------------------------------------------------------ isolation


def test_no_tty_is_attached(conform: Conformance) -> None:
    """Commands run without a TTY attached (stdin is empty, nothing waits)."""
    command = (
        "test -t 0; echo stdin=$?; test -t 1; echo stdout=$?; test -t 2; echo stderr=$?; "
        "tty; cat; echo read-nothing"
    )
    text = bash(conform, {"command": command}, conform.session())
    assert text == ToolText("stdin=1\nstdout=1\nstderr=1\nnot a tty\nread-nothing\n")


def test_each_command_gets_a_new_process_group(conform: Conformance) -> None:
    """Each command gets a new process group (the command's bash leads its own): each
    call of a session a group of its own, never its workspace keeper's (pid 1 of the
    workspace's PID namespace, whose numbers the command sees)."""
    session = conform.session()
    groups = []
    for _ in range(2):
        text = bash(conform, {"command": "echo $$; ps -o pgid= -p $$ | tr -d ' '; "
                                         "ps -o pgid= -p 1 | tr -d ' '"}, session)
        pid, pgid, keeper_group = text.text.split()
        assert pid == pgid and pgid != keeper_group, text.text
        groups.append(pgid)
    assert groups[0] != groups[1]


def test_secrets_are_isolated(conform: Conformance) -> None:
    """Environment variables holding secrets are isolated: the worker's *_TOKEN and
    BASHFLEET_* variables are not passed on; a plain one the operator names is."""
    command = (
        f'echo "token=${{{SECRET_VAR}-unset}} url=${{BASHFLEET_REDIS_URL-unset}} '
        f'note=${{{PLAIN_VAR}-unset}}"; env | cut -d= -f1 | grep -e ^BASHFLEET_ -e {SECRET_VAR}'
    )
    text = bash(conform, {"command": command}, conform.session())
    # Only the engine's own per-call marker (how it finds the call's processes) is there.
    assert text == ToolText(f"token=unset url=unset note={PLAIN_VALUE}\nBASHFLEET_CALL_MARKER\n")
    # The value, should it reach the output some other way, is redacted.
    leaked = bash(conform, {"command": f"echo {SECRET_VALUE}"}, conform.session())
    assert SECRET_VALUE not in leaked.text
