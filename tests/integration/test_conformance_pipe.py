"""The `pipe` dialect through the fleet: each behaviour of its tool, one test each.

Every call goes `get_dialect("pipe").call(...)` -> Fleet -> Redis -> the `conform`
worker process, and the test reads the text the model would read.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from bashfleet.client import BashfleetError
from bashfleet.client.dialects import SessionState, ToolText, get_dialect

from .conformance_helpers import (
    HOST,
    Conformance,
    Elapsed,
    conform_fixture,  # noqa: F401 - the `conform` fixture
    poll,
)

PIPE = get_dialect("pipe")


def bash(conform: Conformance, args: dict[str, object], session: SessionState) -> ToolText:
    return conform.call(PIPE, "bash", args, session)


def stream(text: str, name: str) -> str:
    """The body of a `stdout:` / `stderr:` block of a pipe text."""
    found = re.search(rf"(?:^|\n\n){name}[^\n]*:\n(.*?)(?=\n\n(?:stderr|exit code|\[|Full))", text,
                      re.S)
    assert found is not None, text
    return found.group(1)


# ---------------------------------------------------------------------------- running


def test_tool_schema(conform: Conformance) -> None:
    """Tool Schema: one `bash` tool with `command`, `timeout` (ms), `check_pid`, `kill_pid`."""
    spec = PIPE.tools()[0].as_json("function")  # the pipe tool's own shape
    assert spec["name"] == "bash"
    assert list(spec["parameters"]["properties"]) == ["command", "timeout", "check_pid", "kill_pid"]
    assert "(default: 120000)" in spec["parameters"]["properties"]["timeout"]["description"]
    policy = PIPE.policy()
    assert (policy.default_timeout_s, policy.on_timeout) == (120.0, "background")
    # The default is not a short one: a command longer than a second stays in the foreground.
    text = bash(conform, {"command": "sleep 1.2; echo done"}, conform.session())
    assert text == ToolText("stdout:\ndone\n\nstderr:\n\n\nexit code: 0")


def test_stateless_with_the_session_cwd(conform: Conformance) -> None:
    """Shell model: stateless (a fresh bash -c per command), the cwd fixed at session start."""
    session = conform.session()
    first = bash(conform, {"command": "cd / && export PIPE_X=1 && pwd"}, session)
    assert first == ToolText("stdout:\n/\n\nstderr:\n\n\nexit code: 0")
    second = bash(conform, {"command": 'pwd; echo "${PIPE_X-unset}"'}, session)
    assert second == ToolText(f"stdout:\n{conform.workdir}\nunset\n\nstderr:\n\n\nexit code: 0")
    assert conform.fleet.last.host == HOST


def test_separate_streams(conform: Conformance) -> None:
    """Stderr handling: stdout and stderr apart -- `stdout:`, `stderr:`, `exit code: 0`."""
    text = bash(
        conform, {"command": "echo out1; echo err1 >&2; echo out2; echo err2 >&2"},
        conform.session(),
    )
    assert text == ToolText("stdout:\nout1\nout2\n\nstderr:\nerr1\nerr2\n\nexit code: 0")


def test_non_zero_exit_is_an_error(conform: Conformance) -> None:
    """Error (non-zero exit): the same format, with the result flagged as an error."""
    text = bash(conform, {"command": "echo partial; echo bad >&2; exit 3"}, conform.session())
    assert text == ToolText("stdout:\npartial\n\nstderr:\nbad\n\nexit code: 3", is_error=True)


def test_ansi_and_control_characters_are_stripped(conform: Conformance) -> None:
    """Sanitization: strip CSI and OSC sequences; keep tab, newline, CR, drop other bytes
    <= 0x1F; `\\r\\n` -> `\\n`."""
    command = (
        r"printf '\033[1;31mred\033[0m \033]0;title\007plain\001\002\tTab\r\nnext\n'; "
        r"printf '\033[33mwarn\033[0m\n' >&2"
    )
    text = bash(conform, {"command": command}, conform.session())
    assert text == ToolText("stdout:\nred plain\tTab\nnext\n\nstderr:\nwarn\n\nexit code: 0")


# ------------------------------------------------------------------------- truncation


def test_line_limit_keeps_the_last_2000_lines_without_a_file(conform: Conformance) -> None:
    """Tail truncation to 2000 lines at most, per stream; a cut by lines alone (3000 short
    lines, 20 KB in all) creates no temp file."""
    before = conform.spill_files()
    text = bash(conform, {"command": "seq 1 3000; seq 5001 8000 >&2"}, conform.session())
    assert stream(text.text, "stdout").splitlines() == [str(n) for n in range(1001, 3001)]
    assert stream(text.text, "stderr").splitlines() == [str(n) for n in range(6001, 8001)]
    assert text.text.startswith("stdout:\n1001\n")
    for name in ("stdout", "stderr"):
        assert (
            f"[{name}: Showing last 2000 of 3000 lines. Full output not saved (50KB or less)"
            in text.text
        )
    assert "Full output:" not in text.text and not text.is_error
    # No file on the worker host: the spill files were dropped, nothing is readable.
    assert conform.spill_files() == before
    with pytest.raises(BashfleetError, match="no job or kept output"):
        conform.fleet.read_output(conform.fleet.last.call_id)


def test_a_60kb_single_line_shows_its_tail(conform: Conformance) -> None:
    """Edge case: a single line past 50 KB shows the tail of that line."""
    command = "head -c 20480 /dev/zero | tr '\\0' a; head -c 40960 /dev/zero | tr '\\0' b"
    text = bash(conform, {"command": command}, conform.session())
    shown = stream(text.text, "stdout")
    assert shown == "a" * (51200 - 40960) + "b" * 40960  # the last 51,200 bytes
    found = re.search(r"\[stdout: Showing last 51200 of 61440 bytes\. Full output: (\S+)\]",
                      text.text)
    assert found is not None, text.text
    assert conform.read_all(conform.fleet.last.call_id) == "a" * 20480 + "b" * 40960


def test_spill_file_past_50kb_holds_the_full_output(conform: Conformance) -> None:
    """Filesystem offloading only when the total passes 50 KB: the full untruncated
    output goes to a file, and the notice says where (`Full output: <path>`)."""
    expected = "".join(f"{n}\n" for n in range(1, 20001))  # 108,894 bytes
    session = conform.session()
    text = bash(conform, {"command": "seq 1 20000"}, session)
    found = re.search(r"\[stdout: Showing last 2000 of 20000 lines\. Full output: (\S+)\]",
                      text.text)
    assert found is not None, text.text
    path = Path(found.group(1))
    # The file is in the session workspace's output directory on the worker host: the
    # model's next call reads it at that path, and so does the fleet.
    assert path.is_relative_to(conform.out_dir(session))
    assert conform.read_all(conform.fleet.last.call_id) == expected
    assert conform.read_in_workspace(session, path) == expected
    assert path.read_text() == expected


# ------------------------------------------------------------------------- background


def background(
    conform: Conformance, command: str, session: SessionState, timeout_ms: int = 800
) -> tuple[ToolText, int]:
    """Run `command` past its timeout; the backgrounded text and its pid."""
    with Elapsed() as took:
        text = bash(conform, {"command": command, "timeout": timeout_ms}, session)
    assert took.seconds < timeout_ms / 1000 + 8, "the call did not return at its timeout"
    found = re.match(r"\[Command backgrounded after [\d.]+s timeout \(pid (\d+)\)\.", text.text)
    assert found is not None and not text.is_error, text.text
    return text, int(found.group(1))


def test_timeout_auto_backgrounds_with_the_pid(conform: Conformance) -> None:
    """Auto-backgrounding: a command past its timeout is detached and the call returns at
    once with its partial output and a background notice (pid, full output file,
    check_pid / kill_pid), then what still runs and when it last printed."""
    session = conform.session()
    text, pid = background(conform, "echo started; echo warming >&2; exec sleep 60", session)
    found = re.fullmatch(
        r"\[Command backgrounded after 0\.8s timeout \(pid (\d+)\)\. Partial output:\n\n"
        r"stdout:\nstarted\n\nstderr:\nwarming\n\n"
        r"Full output: (\S+)\nFull stderr: (\S+)\n"
        r"Use check_pid or kill_pid to manage\.\]\n\n"
        r"\[Processes still running:\n(  pid \d+ \w+, [\d.]+s CPU: .*\n)+"
        r"Last output \d+\.\ds ago\.\]",
        text.text,
    )
    assert found is not None, text.text
    assert f"  pid {pid} " in text.text and "sleep 60" in text.text
    out_path, err_path = Path(found.group(2)), Path(found.group(3))
    # The files and the pid are the workspace's: the model's next call reads and sees them.
    assert out_path.is_relative_to(conform.out_dir(session))
    assert conform.read_in_workspace(session, out_path) == "started\n"
    assert conform.read_in_workspace(session, err_path) == "warming\n"
    assert conform.alive(session, pid), "the backgrounded process keeps running"
    assert conform.in_workspace(session, f"ps -o args= -p {pid}").stdout == "sleep 60\n"
    killed = bash(conform, {"kill_pid": pid}, session)
    assert killed.text.startswith(f"[Process {pid} killed (SIGTERM).")
    conform.wait_gone(session, [pid])


def new_lines(text: str) -> list[str]:
    """The output lines a check_pid text shows (running: the new output; ended: stdout)."""
    found = re.search(r"New output since last check \(\d+ lines\):\n(.*?)\n\n(?:stderr|Full)",
                      text, re.S)
    if found:
        return found.group(1).splitlines()
    if "still running" in text:
        return []
    return stream(text, "stdout").splitlines()


def test_check_pid_shows_only_new_output(conform: Conformance) -> None:
    """Background process management: `check_pid` returns the new output -- "New output
    since last check"; once finished, "Process N exited with code N"."""
    session, tag = conform.session(), uuid.uuid4().hex[:8]
    steps = [conform.workdir / f"{tag}.step{n}" for n in (2, 3, 4)]
    waits = "".join(
        f"until [ -e {path.name} ]; do sleep 0.05; done; echo line{n}; "
        for n, path in enumerate(steps, 2)
    )
    _, pid = background(conform, f"echo line1; {waits}exit 3", session)
    seen: list[str] = []

    def check() -> ToolText:
        text = bash(conform, {"check_pid": pid}, session)
        seen.extend(new_lines(text.text))
        return text

    def check_until(wanted: str) -> ToolText:
        return poll(check, lambda text: wanted in text.text, f"{wanted!r} in a check")

    quiet = check()
    assert quiet.text.startswith(
        f"[Process {pid} still running.\n\nNo new output since last check."
    )
    steps[0].touch()
    assert check_until("line2").text.startswith(f"[Process {pid} still running.")
    steps[1].touch()
    check_until("line3")
    steps[2].touch()
    final = check_until("exited")
    assert final.text.startswith(f"[Process {pid} exited with code 3.")
    # Every line once, in order: line1 was in the notice, so no check repeats it.
    assert seen == ["line2", "line3", "line4"]
    assert check().text.startswith(f"[Process {pid} exited with code 3.\n\nstdout:\n\n\nstderr:")


def test_kill_pid_ends_the_whole_group(conform: Conformance) -> None:
    """Process group isolation, the entire tree killed: kill_pid ends the command and the
    processes it started, and returns its final output."""
    session = conform.session()
    text, pid = background(
        conform, "sleep 300 & echo child=$!; echo more >&2; wait", session,
    )
    child = int(re.search(r"child=(\d+)", text.text).group(1))  # type: ignore[union-attr]
    assert conform.alive(session, pid) and conform.alive(session, child)
    killed = bash(conform, {"kill_pid": pid}, session)
    # Its final output: what no look showed yet (child= was in the notice).
    assert killed.text.startswith(f"[Process {pid} killed (SIGTERM).\n\nstdout:\n\n\nstderr:\n")
    assert not killed.is_error and "[background process" not in killed.text
    assert "\n\nFull output: " in killed.text
    conform.wait_gone(session, [pid, child])
    assert session.jobs[session.pids[pid]].killed
    after = bash(conform, {"check_pid": pid}, session)
    assert after.text.startswith(f"[Process {pid} was killed by SIGTERM.")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"command": "touch {marker}", "check_pid": 1}, "(got command and check_pid)"),
        ({"command": "touch {marker}", "kill_pid": 1}, "(got command and kill_pid)"),
        ({"check_pid": 1, "kill_pid": 1}, "(got check_pid and kill_pid)"),
        ({}, "(got none of them)"),
    ],
)
def test_parameters_are_mutually_exclusive(
    conform: Conformance, args: dict[str, object], message: str
) -> None:
    """The parameters are mutually exclusive: `command` runs a new command, `check_pid`
    checks on a background process, `kill_pid` terminates one -- two at once run nothing."""
    marker = conform.workdir / f"{uuid.uuid4().hex}.ran"
    filled = {k: v.format(marker=marker) if isinstance(v, str) else v for k, v in args.items()}
    text = bash(conform, filled, conform.session())
    assert text == ToolText(
        f"Error: give exactly one of command, check_pid or kill_pid {message}", is_error=True
    )
    assert not marker.exists()


def test_unknown_pid_is_an_error(conform: Conformance) -> None:
    """check_pid of a pid this session never backgrounded: a clear error."""
    text = bash(conform, {"check_pid": 1}, conform.session())
    assert text == ToolText(
        "Error: no backgrounded process with pid 1 in this session (known pids: none)", True
    )
