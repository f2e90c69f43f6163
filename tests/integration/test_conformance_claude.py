"""The `claude` dialect through the fleet: each behaviour its tools promise, one test each."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from bashfleet.client.dialects import SessionState, ToolText, get_dialect
from bashfleet.client.dialects.claude import EMPTY_OUTPUT

from .conformance_helpers import (
    PLAIN_VALUE,
    PLAIN_VAR,
    Conformance,
    Elapsed,
    conform_fixture,  # noqa: F401 - the `conform` fixture
    poll,
)

CLAUDE = get_dialect("claude")


def call(conform: Conformance, tool: str, args: dict[str, object], session: SessionState
         ) -> ToolText:
    return conform.call(CLAUDE, tool, args, session)


def bash(conform: Conformance, args: dict[str, object], session: SessionState) -> ToolText:
    return call(conform, "Bash", args, session)


def start(conform: Conformance, command: str, session: SessionState) -> str:
    """Run in background; the bash_id, returned at once."""
    with Elapsed() as took:
        text = bash(conform, {"command": command, "run_in_background": True}, session)
    found = re.fullmatch(r"Command running in background with ID: (\S+)", text.text)
    assert found is not None and not text.is_error, text.text
    assert took.seconds < 5
    return found.group(1)


def output(conform: Conformance, bash_id: str, session: SessionState,
           **args: object) -> ToolText:
    return call(conform, "BashOutput", {"bash_id": bash_id, **args}, session)


def stdout_of(text: ToolText) -> str:
    """The `<stdout>` block of a BashOutput text ("" when there is none)."""
    found = re.search(r"<stdout>\n(.*)\n</stdout>", text.text, re.S)
    return found.group(1) if found else ""


def stdout_until_completed(conform: Conformance, bash_id: str, session: SessionState,
                           pattern: str | None = None) -> tuple[str, ToolText]:
    """Everything the job printed (through `filter` `pattern`), read by BashOutput until
    it says `completed`, and that last answer. Each read gives only what is new: one
    may land between the job's last line and its end (the line then comes with
    `running`, and `completed` with nothing new)."""
    read: list[str] = []

    def completed() -> ToolText:
        text = output(conform, bash_id, session,
                      **({"filter": pattern} if pattern is not None else {}))
        if stdout_of(text):
            read.append(stdout_of(text))
        return text

    last = poll(completed, lambda t: "completed" in t.text, "the job to complete")
    return "\n".join(read), last


# ------------------------------------------------------------------------ foreground


def test_three_tools(conform: Conformance) -> None:
    """`Bash` (with `run_in_background`), `BashOutput` {bash_id} (with its `filter`),
    `KillBash`."""
    tools = {spec.name: spec.input_schema for spec in CLAUDE.tools()}
    assert list(tools) == ["Bash", "BashOutput", "KillBash"]
    assert list(tools["Bash"]["properties"]) == [
        "command", "timeout", "description", "run_in_background",
    ]
    assert list(tools["BashOutput"]["properties"]) == ["bash_id", "filter"]
    assert list(tools["KillBash"]["properties"]) == ["bash_id"]
    assert bash(conform, {"command": "true", "description": "Do nothing"},
                conform.session()) == ToolText(EMPTY_OUTPUT)


def test_foreground_returns_stdout_and_stderr(conform: Conformance) -> None:
    """A foreground command returns its output, stdout and stderr."""
    text = bash(conform, {"command": "echo out; echo err >&2; echo end"}, conform.session())
    assert text == ToolText("out\nerr\nend")
    failed = bash(conform, {"command": "echo no; exit 2"}, conform.session())
    assert failed == ToolText("Exit code 2\nno", is_error=True)


def test_timeout_default_and_maximum(conform: Conformance) -> None:
    """`timeout` is optional (120 s by default for a foreground command); above the
    600000 ms maximum the call is refused and nothing runs."""
    policy = CLAUDE.policy()
    assert (policy.default_timeout_s, policy.max_timeout_s) == (120.0, 600.0)
    session = conform.session()
    marker = conform.workdir / f"{uuid.uuid4().hex}.ran"
    refused = bash(conform, {"command": f"touch {marker}", "timeout": 600001}, session)
    assert refused.is_error and refused.text.startswith(
        "InputValidationError: Bash failed due to the following issue:\n"
        "timeout 600001 ms is above the maximum of 600000 ms"
    )
    assert not marker.exists()
    assert bash(conform, {"command": f"touch {marker}", "timeout": 600000}, session) == ToolText(
        EMPTY_OUTPUT
    )
    assert marker.exists()


def test_timeout_terminates_the_command(conform: Conformance) -> None:
    """A command past its timeout is terminated and the call returns a timeout error,
    with what it was running, and when it last printed."""
    session = conform.session()
    with Elapsed() as took:
        text = bash(
            conform, {"command": "sleep 300 & echo child=$!; echo partial; wait", "timeout": 1000},
            session,
        )
    assert took.seconds < 10
    found = re.fullmatch(
        r"Command timed out after 1\.0s\nchild=(\d+)\npartial\n"
        r"Processes at the timeout, now killed:\n((?:  pid \d+ \w+, [\d.]+s CPU: .*\n)+)"
        r"Last output \d+\.\ds ago\.",
        text.text,
    )
    assert found is not None and text.is_error, text.text
    assert "sleep 300" in found.group(2)
    # The child's pid is the session workspace's, where it is gone too.
    conform.wait_gone(session, [int(found.group(1))])


def test_long_output_is_truncated_at_30000_characters(conform: Conformance) -> None:
    """Foreground output past 30,000 characters is truncated; the full output stays
    readable on its host."""
    full = ("x" * 99 + "\n") * 1000  # 100,000 characters
    text = bash(conform, {"command": "python3 -c \"print(('x' * 99 + '\\n') * 1000, end='')\""},
                conform.session())
    found = re.fullmatch(
        r"((?:x{99}\n){299}x{99})\n\n\.\.\. \[700 lines truncated\] \.\.\.\n\n"
        r"Full output: (\S+) on host conform",
        text.text,
    )
    assert found is not None and not text.is_error, text.text[-300:]
    assert len(found.group(1)) <= 30000
    assert Path(found.group(2)).read_text() == full
    assert conform.read_all(conform.fleet.last.call_id) == full


def test_ansi_color_codes_are_stripped(conform: Conformance) -> None:
    """ANSI color codes are stripped from all output (foreground and background)."""
    command = r"printf '\033[1;32mgreen\033[0m and \033[4;31mred\033[0m\n'"
    session = conform.session()
    assert bash(conform, {"command": command}, session) == ToolText("green and red")
    bash_id = start(conform, command, session)
    assert stdout_until_completed(conform, bash_id, session)[0] == "green and red"


def test_environment_persists_across_calls(conform: Conformance) -> None:
    """Environment variables persist across sequential `Bash` calls, as in one session:
    exports, and the directory, as one shell would."""
    session = conform.session()
    sub = conform.workdir / f"fr9-{uuid.uuid4().hex[:6]}"
    sub.mkdir()
    first = bash(conform, {"command": f"export FR9_VALUE='kept it'; cd {sub.name}"}, session)
    assert first == ToolText(EMPTY_OUTPUT)
    second = bash(conform, {"command": 'echo "$FR9_VALUE"; pwd'}, session)
    assert second == ToolText(f"kept it\n{sub}")
    # A fresh session starts clean.
    assert bash(conform, {"command": 'echo "${FR9_VALUE-unset}"'}, conform.session()) == ToolText(
        "unset"
    )


def test_an_unset_worker_variable_stays_unset(conform: Conformance) -> None:
    """`unset` of a variable the worker provides holds on later calls, background ones
    included."""
    session = conform.session()
    probe = f'echo "${{{PLAIN_VAR}-unset}}"'
    assert bash(conform, {"command": probe}, session) == ToolText(PLAIN_VALUE)
    bash(conform, {"command": f"unset {PLAIN_VAR}"}, session)
    assert bash(conform, {"command": probe}, session) == ToolText("unset")
    bash_id = start(conform, probe, session)
    assert stdout_until_completed(conform, bash_id, session)[0] == "unset"


# ------------------------------------------------------------------------ background


def test_background_returns_an_id_and_bash_output_reads_it(conform: Conformance) -> None:
    """With `run_in_background` true, `Bash` returns a `bash_id` immediately; `BashOutput`
    returns the output accumulated since."""
    session = conform.session()
    go = conform.workdir / f"{uuid.uuid4().hex}.go"
    bash_id = start(conform, f'echo waiting; until [ -e {go.name} ]; do sleep 0.05; done; '
                             f'echo "done"', session)
    first = poll(lambda: output(conform, bash_id, session), lambda t: "waiting" in t.text,
                 "the first line")
    assert first == ToolText("<status>running</status>\n\n<stdout>\nwaiting\n</stdout>")
    go.touch()
    read, done = stdout_until_completed(conform, bash_id, session)
    # Only what is new since the last read: `done` once, with `completed` unless a read
    # landed between the job's last line and its end.
    assert read == "done"
    ended = "<status>completed</status>\n\n<exit_code>0</exit_code>"
    assert done in (ToolText(f"{ended}\n\n<stdout>\ndone\n</stdout>"), ToolText(ended))
    assert output(conform, bash_id, session) == ToolText(
        "<status>completed</status>\n\n<exit_code>0</exit_code>"
    )


def test_bash_output_filter(conform: Conformance) -> None:
    """`BashOutput` filters output lines with a regular expression; lines that do not
    match are no longer available to read."""
    session = conform.session()
    bash_id = start(conform, "printf 'apple\\nbanana\\navocado\\n'", session)
    assert stdout_until_completed(conform, bash_id, session, "^a")[0] == "apple\navocado"
    assert "banana" not in output(conform, bash_id, session).text


def test_bash_output_filter_anchors_at_line_ends(conform: Conformance) -> None:
    """A filter ending in `$` once never matched (lines kept their newline)."""
    session = conform.session()
    bash_id = start(conform, "seq 1 30", session)
    assert stdout_until_completed(conform, bash_id, session, "0$")[0] == "10\n20\n30"


def test_kill_bash_terminates_the_process_group(conform: Conformance) -> None:
    """`KillBash` with a job's ID terminates it: its entire process group, so that no
    orphan process is left."""
    session = conform.session()
    command = "sleep 300 & echo child=$!; wait"
    bash_id = start(conform, command, session)
    seen = poll(lambda: output(conform, bash_id, session), lambda t: "child=" in t.text,
                "the child's pid")
    child, leader = int(stdout_of(seen).split("=")[1]), session.jobs[bash_id].pid
    # Both pids are the session workspace's (the numbers its next call would use).
    assert conform.alive(session, child) and conform.alive(session, leader)
    killed = call(conform, "KillBash", {"bash_id": bash_id}, session)
    assert killed == ToolText(f"Successfully killed shell: {bash_id} ({command})")
    conform.wait_gone(session, [leader, child])
    assert output(conform, bash_id, session) == ToolText("<status>killed</status>")
    again = call(conform, "KillBash", {"bash_id": bash_id}, session)
    assert again == ToolText(
        f"Shell {bash_id} is not running, so cannot be killed (status: killed)", True
    )


def test_an_invalid_bash_id_is_a_clear_error(conform: Conformance) -> None:
    """`BashOutput` or `KillBash` with a non-existent or expired ID returns a clear error
    message."""
    for tool in ("BashOutput", "KillBash"):
        text = call(conform, tool, {"bash_id": "j0000nothere"}, conform.session())
        assert text == ToolText("No shell found with ID: j0000nothere", is_error=True)


def test_task_output_and_task_stop_the_names_claude_code_uses_today(
        conform: Conformance) -> None:
    """Claude Code's TaskOutput (blocking until the task ends) and TaskStop, on the fleet."""
    session = conform.session()
    quick = start(conform, "sleep 1; echo built", session)
    with Elapsed() as took:
        done = call(conform, "TaskOutput", {"task_id": quick, "timeout": 30000}, session)
    assert took.seconds < 25, "it returned once the task ended, not at its timeout"
    assert done == ToolText(
        f"<retrieval_status>success</retrieval_status>\n\n<task_id>{quick}</task_id>\n\n"
        "<task_type>local_bash</task_type>\n\n<status>completed</status>\n\n"
        "<exit_code>0</exit_code>\n\n<output>\nbuilt\n</output>")
    slow = start(conform, "sleep 300", session)
    waited = call(conform, "TaskOutput", {"task_id": slow, "timeout": 300}, session)
    assert waited.text.startswith("<retrieval_status>timeout</retrieval_status>")
    assert "<status>running</status>" in waited.text
    stopped = call(conform, "TaskStop", {"task_id": slow}, session)
    assert stopped == ToolText(f"Successfully stopped task: {slow} (sleep 300)")
    assert "<status>killed</status>" in call(conform, "TaskOutput", {"task_id": slow},
                                             session).text
