"""The `pi` dialect through the fleet: each behaviour of pi's tool-call path.

Pi's PTY path, shell snapshots, the renderer and the user bang-command surface are not
part of the tool a model calls through bashfleet and are not tested here.
"""

from __future__ import annotations

import re
import uuid

from bashfleet.client.dialects import SessionState, ToolText, get_dialect
from bashfleet.client.dialects.pi import PiDialect
from bashfleet.worker.wire.models import DEFAULT_INTERCEPT_RULES

from .conformance_helpers import (
    Conformance,
    Elapsed,
    conform_fixture,  # noqa: F401 - the `conform` fixture
)

PI = get_dialect("pi")


def bash(
    conform: Conformance, args: dict[str, object], session: SessionState | None = None,
    dialect: PiDialect | None = None,
) -> ToolText:
    return conform.call(dialect or PI, "bash", args, session or conform.session())


def test_tool_schema(conform: Conformance) -> None:
    """Tool-call surface: `bash` {command, timeout (seconds), cwd, head, tail}."""
    schema = PI.tools()[0].input_schema
    assert list(schema["properties"]) == ["command", "timeout", "cwd", "head", "tail"]
    assert schema["required"] == ["command"]
    assert bash(conform, {"command": "echo hi"}) == ToolText("hi\n")


def test_output_is_combined(conform: Conformance) -> None:
    """stdout and stderr come merged."""
    assert bash(conform, {"command": "echo a; echo b >&2; echo c"}) == ToolText("a\nb\nc\n")


def test_empty_output_is_no_output(conform: Conformance) -> None:
    """Result shaping: empty output becomes `(no output)`."""
    assert bash(conform, {"command": "true"}) == ToolText("(no output)")


def test_non_zero_exit(conform: Conformance) -> None:
    """Exit-code mapping: a non-zero exit is a tool error, "... Command exited with code N"."""
    text = bash(conform, {"command": "echo bad; exit 4"})
    assert text == ToolText("bad\n\n\nCommand exited with code 4", is_error=True)
    empty = bash(conform, {"command": "exit 2"})
    assert empty == ToolText("(no output)\n\nCommand exited with code 2", is_error=True)


def test_missing_exit_status(conform: Conformance) -> None:
    """Exit-code mapping: a missing exit code is a tool error, "... missing exit status"
    (a command ended by a signal has no exit code)."""
    text = bash(conform, {"command": "echo dying; kill -9 $$"})
    assert text == ToolText("dying\n\n\nCommand failed: missing exit status", is_error=True)


# -------------------------------------------------------------------------- timeout


def test_timeout_is_clamped_to_1_3600_seconds(conform: Conformance) -> None:
    """The timeout is clamped to [1, 3600] seconds: 0.01 waits a second; 99999 is taken
    as 3600 (the fleet refuses a timeout above the policy's maximum, so it was clamped)."""
    assert PI.policy().max_timeout_s == 3600.0
    with Elapsed() as took:
        text = bash(conform, {"command": "echo start; sleep 30", "timeout": 0.01})
    assert text == ToolText("[Command timed out after 1 seconds]\nstart\n", is_error=True)
    assert 0.9 <= took.seconds < 10
    assert bash(conform, {"command": "echo long", "timeout": 99999}) == ToolText("long\n")


def test_timeout_without_output(conform: Conformance) -> None:
    """Cancellation: a timeout maps to a tool error with its annotation, which
    `OutputSink.dump(notice)` puts first: `[notice]` and a newline, then the output."""
    text = bash(conform, {"command": "sleep 30", "timeout": 1})
    assert text == ToolText("[Command timed out after 1 seconds]\n", is_error=True)


# ------------------------------------------------------------ head / tail normalization


def test_trailing_head_is_lifted_and_the_command_runs_without_it(conform: Conformance) -> None:
    """Input normalization: a trailing `| head -n N` is lifted into a structured limit.
    Proof that the pipe is gone: with it, head would exit after two lines and the
    command's later `echo` would die of SIGPIPE before touching the marker."""
    marker = conform.workdir / f"{uuid.uuid4().hex}.marker"
    command = f"{{ seq 1 5; sleep 0.5; echo more; touch {marker}; }} | head -n 2"
    assert bash(conform, {"command": command}) == ToolText("1\n2\n")
    assert marker.exists()


def test_trailing_tail_and_short_forms_are_lifted(conform: Conformance) -> None:
    """Normalization of `| tail -n N`, `| head -N` and `| tail -N`."""
    assert bash(conform, {"command": "seq 1 5 | tail -n 2"}) == ToolText("4\n5\n")
    assert bash(conform, {"command": "seq 1 5 | head -2   "}) == ToolText("1\n2\n")
    assert bash(conform, {"command": "seq 1 5 | tail -3"}) == ToolText("3\n4\n5\n")


def test_explicit_head_and_tail_win(conform: Conformance) -> None:
    """Explicit `head`/`tail` arguments override the lifted values; head/tail filters
    apply to the final output text (head, then tail)."""
    assert bash(conform, {"command": "seq 1 10 | head -n 3", "head": 5}) == ToolText(
        "1\n2\n3\n4\n5\n"
    )
    assert bash(conform, {"command": "seq 1 10", "head": 6, "tail": 2}) == ToolText("5\n6\n")


def test_head_shows_the_first_lines_of_the_whole_output(conform: Conformance) -> None:
    """`head: 3` on `seq 1 100000` once showed lines 91468-91470 (the head of the 50 KB
    tail) under a notice about that tail. Head is the first lines of the whole output,
    tail its last, and the notice says exactly which are shown."""
    text = bash(conform, {"command": "seq 1 100000", "head": 3})
    artifact = conform.fleet.last.call_id
    assert text == ToolText(f"1\n2\n3\n\n\n[Showing lines 1-3 of 100000. Full: artifact://{artifact}]")
    lifted = bash(conform, {"command": "seq 1 100000 | head -n 2"})
    assert lifted.text.startswith("1\n2\n\n\n[Showing lines 1-2 of 100000. Full: artifact://")
    both = bash(conform, {"command": "seq 1 100000", "head": 50000, "tail": 2})
    assert both.text.startswith("49999\n50000\n\n\n[Showing lines 49999-50000 of 100000.")
    assert conform.read_all(artifact).startswith("1\n2\n3\n4\n")


# ------------------------------------------------------------------------------ cwd


def test_cwd_is_resolved_against_the_session_and_validated(conform: Conformance) -> None:
    """CWD validation: `cwd` is resolved relative to the session's cwd; a missing path
    gets `Working directory does not exist: ...`; a non-directory `Working directory is
    not a directory: ...`."""
    sub = conform.workdir / f"sub-{uuid.uuid4().hex[:6]}"
    sub.mkdir()
    (sub / "file").write_text("x")
    assert bash(conform, {"command": "pwd", "cwd": sub.name}) == ToolText(f"{sub}\n")
    missing = bash(conform, {"command": "pwd", "cwd": "nowhere"})
    assert missing == ToolText(
        f"Working directory does not exist: {conform.workdir / 'nowhere'}", is_error=True
    )
    not_dir = bash(conform, {"command": "pwd", "cwd": f"{sub.name}/file"})
    assert not_dir == ToolText(f"Working directory is not a directory: {sub / 'file'}", True)


def test_a_bad_cwd_on_the_first_call_leaves_the_session_in_its_project(
        conform: Conformance) -> None:
    """A session's first call makes its workspace, at the project its cwd is in (a
    session starts where it was opened). A first call whose cwd is missing is told so,
    and the session's next calls still run in its project: the workspace is the project
    directory, not a fresh one where the session's own cwd does not exist."""
    session = conform.session()
    missing = bash(conform, {"command": "pwd", "cwd": "nowhere"}, session)
    assert missing == ToolText(
        f"Working directory does not exist: {conform.workdir / 'nowhere'}", is_error=True
    )
    assert bash(conform, {"command": "pwd"}, session) == ToolText(f"{conform.workdir}\n")


# ----------------------------------------------------------------------- interception


def test_interception_blocks_only_when_the_tool_is_available(conform: Conformance) -> None:
    """Interception: a command is blocked only when a rule's regex matches and the tool it
    suggests is present; the message is `Blocked: ...` with the original command."""
    marker = conform.workdir / f"{uuid.uuid4().hex}.ran"
    command = f"grep -c x /dev/null; touch {marker}"
    with_grep = PiDialect(intercept=DEFAULT_INTERCEPT_RULES, available_tools=("read", "grep"))
    blocked = bash(conform, {"command": command}, dialect=with_grep)
    assert blocked == ToolText(
        "Blocked: Use the grep tool to search file contents instead of grep/rg.\n\n"
        f"Original command: {command}",
        is_error=True,
    )
    assert not marker.exists()
    without_grep = PiDialect(intercept=DEFAULT_INTERCEPT_RULES, available_tools=("read",))
    assert bash(conform, {"command": command}, dialect=without_grep) == ToolText("0\n")
    assert marker.exists()


# ------------------------------------------------------------------------- truncation


def test_50kb_utf8_safe_tail_with_an_artifact(conform: Conformance) -> None:
    """OutputSink: an in-memory UTF-8-safe tail buffer (50 KB); the full stream goes to
    an artifact, and the notice says `Full: artifact://<id>` (readable from its host)."""
    full = "é" * 40000 + "\n"  # 80,001 bytes: the cut falls inside a character
    text = bash(conform, {"command": "python3 -c \"print('é' * 40000)\""})
    found = re.fullmatch(
        r"(é+\n)\n\n\[Showing lines 1-1 of 1 \(50\.0KB limit\)\. Full: artifact://(\S+)\]",
        text.text,
    )
    assert found is not None and not text.is_error, text.text[-200:]
    shown = found.group(1)
    assert shown == "é" * 25599 + "\n" and len(shown.encode()) <= 51200
    assert found.group(2) == conform.fleet.last.call_id
    assert conform.read_all(found.group(2)) == full


def test_a_byte_cut_starts_at_the_line_its_notice_names(conform: Conformance) -> None:
    """Past 50 KB the shown text starts at a whole line, the one "Showing lines A-B"
    names (it used to start with a fragment of the line before)."""
    text = bash(conform, {"command": "seq 1 200000"})
    found = re.search(
        r"\n\n\[Showing lines (\d+)-200000 of 200000 \(50\.0KB limit\)\. Full: artifact://\S+\]$",
        text.text,
    )
    assert found is not None and not text.is_error, text.text[-300:]
    assert text.text.split("\n", 1)[0] == found.group(1) == "192687"


def test_escape_sequences_go_and_their_text_stays(conform: Conformance) -> None:
    """Sanitizing: a lone C1 introducer removes only itself; a link ended by U+009C keeps
    its text; two-byte escapes leave no final byte. Pi's text is otherwise as is:
    carriage returns and bidirectional controls are not native's to touch here."""
    command = (
        r"printf 'important\302\220data \033]8;;http://x/\302\234link\033]8;;\302\234 "
        r"hel\033<lo\033s\033u\n'; printf 'a\rb\342\200\256\n'"
    )
    assert bash(conform, {"command": command}) == ToolText(
        "importantdata link hello\na\rb\u202e\n"
    )
