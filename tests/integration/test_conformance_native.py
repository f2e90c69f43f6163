"""bashfleet's own dialect (`native`) through the fleet: each behaviour it promises.

`bash` {command, mode, timeout, cwd, host, session}, `bash_check` {id, grep, offset},
`bash_kill` {id}; 120 s then auto-background; separate streams, tail + error digest,
spill reference, host; what the model reads after a timeout, and the hint that a
command already ran in the session.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from bashfleet.client.dialects import SessionState, ToolText, get_dialect

from .conformance_helpers import (
    HOST,
    Conformance,
    Elapsed,
    conform_fixture,  # noqa: F401 - the `conform` fixture
    poll,
)

NATIVE = get_dialect("native")
#: The second line of every run: where and how long it ran.
WHERE = rf"host {HOST} · call (\S+) · [\d.]+s · cwd (\S+)"


def call(conform: Conformance, tool: str, args: dict[str, object],
         session: SessionState | None = None) -> ToolText:
    return conform.call(NATIVE, tool, args, session or conform.session())


def bash(conform: Conformance, args: dict[str, object],
         session: SessionState | None = None) -> ToolText:
    return call(conform, "bash", args, session)


def test_four_tools(conform: Conformance) -> None:
    """`bash` {command, mode, timeout, cwd, host, session, stdin, tty}, `bash_check` {id,
    grep, offset}, `bash_kill` {id}, `bash_output` {id, offset, stream, grep}, `bash_write`
    {id, input, close, timeout}."""
    tools = {spec.name: spec.input_schema for spec in NATIVE.tools()}
    assert {name: list(schema["properties"]) for name, schema in tools.items()} == {
        "bash": ["command", "mode", "timeout", "cwd", "host", "session", "stdin", "tty"],
        "bash_check": ["id", "grep", "offset"],
        "bash_kill": ["id"],
        "bash_output": ["id", "offset", "stream", "grep"],
        "bash_write": ["id", "input", "close", "timeout"],
    }
    policy = NATIVE.policy()
    assert (policy.default_timeout_s, policy.on_timeout) == (120.0, "background")


def test_separate_streams_and_where_it_ran(conform: Conformance) -> None:
    """Separate streams; the host, call id, duration and cwd of the run."""
    text = bash(conform, {"command": "echo out; echo err >&2; exit 1"})
    found = re.fullmatch(rf"exit code: 1\n{WHERE}\n\nstdout:\nout\n\nstderr:\nerr", text.text)
    assert found is not None and text.is_error, text.text
    assert found.group(1) == conform.fleet.last.call_id and found.group(2) == str(conform.workdir)
    assert bash(conform, {"command": "true"}).text.endswith("\n\n(no output)")


def test_tail_with_error_digest_and_spill_reference(conform: Conformance) -> None:
    """Tail (2000 lines / 50 KB) with exact counts, the error lines found in the part that
    was cut, and where the full output is: the `bash_output` call that reads it (a tool
    the model has) and the file on its host."""
    full = "error: disk quota exceeded\n" + "".join(f"{n}\n" for n in range(1, 3001))
    session = conform.session()
    text = bash(conform, {"command": "echo 'error: disk quota exceeded'; seq 1 3000"}, session)
    call_id = conform.fleet.last.call_id
    found = re.search(
        r"\n\nstdout:\n1001\n(?:.*\n)*?3000\n"
        r"\[stdout cut: showing the last 2000 of 3001 lines \((\d+) of (\d+) bytes, lines limit\)\."
        rf" Full output: bash_output id={call_id} \((\S+) on host {HOST}\)\]\n\n"
        r"error lines in the cut part:\n  error: disk quota exceeded$",
        text.text,
    )
    assert found is not None and not text.is_error, text.text[-600:]
    assert int(found.group(2)) == len(full)
    path = Path(found.group(3))
    # The file is in the session workspace's output directory on its host: the model's
    # next call reads it at that path.
    assert path.is_relative_to(conform.out_dir(session)) and path.read_text() == full
    assert conform.read_in_workspace(session, path) == full
    assert conform.read_all(call_id) == full
    # The hint is a tool call the model can make: following it reads the whole output.
    assert follow_output_hint(conform, {"id": call_id}) == full


def follow_output_hint(conform: Conformance, args: dict[str, object]) -> str:
    """Call `bash_output` as the hint says, then as each answer's `next:` says, to the end."""
    text = ""
    for _ in range(100):
        answer = call(conform, "bash_output", args)
        assert not answer.is_error, answer.text
        head, body, tail = answer.text.split("\n\n")
        assert head.startswith(f"{args['id']} stdout: bytes ")
        text += body + "\n"
        if tail == "end of the output":
            return text
        found = re.fullmatch(rf"next: bash_output id={args['id']} offset=(\d+)", tail)
        assert found is not None, tail
        args = {**args, "offset": int(found.group(1))}
    raise AssertionError("bash_output never reached the end")


def test_timeout_then_auto_background(conform: Conformance) -> None:
    """120 s, then auto-background (here 1 s): the command keeps running as a job on its
    host; the text gives its live processes and the age of its last output."""
    session = conform.session()
    with Elapsed() as took:
        text = bash(conform, {"command": "echo started; exec sleep 300", "timeout": 1}, session)
    assert took.seconds < 10
    found = re.fullmatch(
        rf"timed out after 1s; still running in background as job (\S+) on host {HOST} "
        rf"\(pid (\d+)\)\n{WHERE}\n\nstdout:\nstarted\n\n"
        r"processes still running:\n  pid \2 \w+, [\d.]+s CPU: sleep 300\n"
        r"last output \d+\.\ds ago\n\n"
        r"bash_check id=\1 shows its output; bash_kill id=\1 stops it\.",
        text.text,
    )
    assert found is not None and not text.is_error, text.text
    job, pid = found.group(1), int(found.group(2))
    # The pid is the session workspace's (the number its next call would use).
    assert conform.alive(session, pid)
    checked = call(conform, "bash_check", {"id": job}, session)
    # The check reads on after what the notice showed.
    assert checked.text.startswith(
        f"job {job} on host {HOST}: running\n\noutput since byte 8: none"
    )
    stopped = call(conform, "bash_kill", {"id": job}, session)
    assert stopped.text.startswith(
        f"job {job} on host {HOST}: stopped; killed by signal SIGTERM (15)"
    )
    conform.wait_gone(session, [pid])


def test_background_mode_check_grep_offset_and_kill(conform: Conformance) -> None:
    """mode `background` starts a job and returns at once; `bash_check` shows new output
    (filtered by `grep`, from `offset`); `bash_kill` stops it."""
    session = conform.session()
    go = conform.workdir / f"{uuid.uuid4().hex}.go"
    command = (
        f"echo ok 1; echo bad 2; until [ -e {go.name} ]; do sleep 0.05; done; echo ok 3; "
        "sleep 300"
    )
    text = bash(conform, {"command": command, "mode": "background"}, session)
    found = re.match(
        rf"started in background as job (\S+) on host {HOST} \(pid (\d+), pgid (\d+)\); "
        r"output: (\S+)\n",
        text.text,
    )
    assert found is not None and not text.is_error, text.text
    job = found.group(1)
    output_file = Path(found.group(4))
    assert output_file.is_relative_to(conform.out_dir(session))
    assert conform.alive(session, int(found.group(2)))
    first = poll(lambda: call(conform, "bash_check", {"id": job, "grep": "^ok"}, session),
                 lambda t: "ok 1" in t.text, "the first lines")
    assert "output since byte 0 matching '^ok' (1 line):\nok 1\n" in first.text, first.text
    go.touch()
    later = poll(lambda: call(conform, "bash_check", {"id": job}, session),
                 lambda t: "ok 3" in t.text, "the third line")
    assert "(1 line):\nok 3\n" in later.text, later.text
    again = call(conform, "bash_check", {"id": job, "offset": 0}, session)
    assert "output since byte 0 (3 lines):\nok 1\nbad 2\nok 3\n" in again.text, again.text
    # The output path shown is one the model's next call reads.
    assert conform.read_in_workspace(session, output_file) == "ok 1\nbad 2\nok 3\n"
    stopped = call(conform, "bash_kill", {"id": job}, session)
    assert stopped.text.startswith(f"job {job} on host {HOST}: stopped; killed by signal SIGTERM")
    conform.wait_gone(session, [int(found.group(2))])


def test_bash_check_and_output_grep_anchor_at_line_ends(conform: Conformance) -> None:
    """A `grep` ending in `$` once never matched (lines kept their newline)."""
    session = conform.session()
    text = bash(conform, {"command": "seq 1 30", "mode": "background"}, session)
    found = re.match(r"started in background as job (\S+) ", text.text)
    assert found is not None, text.text
    job = found.group(1)
    checked = poll(lambda: call(conform, "bash_check", {"id": job, "grep": "0$", "offset": 0},
                                session),
                   lambda t: "exited" in t.text or "ended" in t.text, "the job's end")
    assert "10\n20\n30\n" in checked.text and "\n11\n" not in checked.text, checked.text
    sliced = call(conform, "bash_output", {"id": job, "grep": "^2.$"}, session)
    assert "".join(f"{n}\n" for n in range(20, 30)) in sliced.text, sliced.text


def test_kill_ends_processes_that_left_the_group(conform: Conformance) -> None:
    """`bash_kill`: SIGTERM to its process group, SIGKILL after a grace period, then every
    process it started, even those that left the group."""
    session = conform.session()
    text = bash(conform, {"command": "setsid sleep 300 & echo escaped=$!; sleep 300",
                          "mode": "background"}, session)
    job = re.match(r"started in background as job (\S+)", text.text).group(1)  # type: ignore[union-attr]
    seen = poll(lambda: call(conform, "bash_check", {"id": job, "offset": 0}, session),
                lambda t: "escaped=" in t.text, "the escaped pid")
    escaped = int(re.search(r"escaped=(\d+)", seen.text).group(1))  # type: ignore[union-attr]
    # Both pids are the session workspace's.
    assert conform.alive(session, escaped)
    call(conform, "bash_kill", {"id": job}, session)
    conform.wait_gone(session, [escaped, session.jobs[job].pid])


def test_sessions_are_optional_and_report_the_final_cwd(conform: Conformance) -> None:
    """`session`: a fleet session that keeps cwd and environment between calls and stays
    on one host; the run says where it ended. Without one, calls are stateless."""
    session, name = conform.session(), f"s{uuid.uuid4().hex[:8]}"
    sub = conform.workdir / f"nat-{uuid.uuid4().hex[:6]}"
    sub.mkdir()
    first = bash(conform, {"command": f"cd {sub.name}; export NAT_VALUE=1", "session": name},
                 session)
    assert first.text.endswith(
        f"\n\nsession {name}: ended in {sub}; its next call starts there; exported: NAT_VALUE"
    ), first.text
    second = bash(conform, {"command": 'pwd; echo "$NAT_VALUE"', "session": name}, session)
    # It changed nothing: no word about the session.
    assert second.text.endswith(f"\n\nstdout:\n{sub}\n1"), second.text
    stateless = bash(conform, {"command": 'pwd; echo "${NAT_VALUE-unset}"'}, session)
    assert stateless.text.endswith(f"\n\nstdout:\n{conform.workdir}\nunset")
    assert conform.fleet.last.host == HOST


def test_a_rerun_is_told_where_the_earlier_output_is(conform: Conformance) -> None:
    """The same command again within 10 minutes gets a hint with the earlier call, its
    host and how to read its full output."""
    session = conform.session()
    bash(conform, {"command": "seq 1 3000"}, session)
    earlier = conform.fleet.last
    assert earlier.spill is not None
    again = bash(conform, {"command": "seq 1 3000"}, session)
    hint = (
        rf"\n\nnote: the same command ran in this session \d+s ago, as call {earlier.call_id} "
        rf"on host {HOST} \(exit code 0\); its full output: bash_output "
        rf"id={earlier.call_id} \({re.escape(earlier.spill.stdout_path or '')} on host {HOST}\)$"
    )
    assert re.search(hint, again.text), again.text[-400:]
    assert conform.read_all(earlier.call_id).startswith("1\n2\n3\n")
    other = bash(conform, {"command": "seq 1 3"}, session)
    assert "same command" not in other.text


def test_system_errors_are_not_command_failures(conform: Conformance) -> None:
    """The engine's system errors (could not spawn, bad cwd, policy block) are told apart
    from the command's own failure, and a host that is not there is named."""
    gone = conform.workdir / "no-such-dir"
    text = bash(conform, {"command": "true", "cwd": str(gone)})
    assert re.fullmatch(
        rf"system error \(bad_cwd\): Working directory does not exist: {gone}\n"
        rf"host {HOST} · call \S+ · [\d.]+s",
        text.text,
    ) and text.is_error, text.text
    nohost = bash(conform, {"command": "true", "host": "nohost"})
    assert nohost.is_error and nohost.text.startswith(
        "[system error: HostUnavailable: no live worker for host 'nohost'"
    )


# -------------------------------------------------------------------------- fidelity


def test_binary_output_is_reported_with_its_spill_file(conform: Conformance) -> None:
    """Binary output (a NUL byte in its first 8 KiB) is `[binary output: N bytes, saved
    to <file> on host <host>]`, and the file holds the bytes."""
    command = r"printf 'PK\003\004\000\000'; head -c 500 /dev/zero; echo"
    session = conform.session()
    text = bash(conform, {"command": command}, session)
    found = re.search(
        rf"\n\nstdout:\n\[binary output: 507 bytes, saved to (\S+) on host {HOST}\]$", text.text
    )
    assert found is not None and not text.is_error, text.text
    # The worker runs on this machine: its spill file holds the bytes as written, and the
    # model's next call reads it at that path.
    assert Path(found.group(1)).read_bytes() == b"PK\x03\x04\x00\x00" + b"\x00" * 500 + b"\n"
    assert conform.in_workspace(session, f"od -An -c {found.group(1)} | head -1").stdout \
        .split()[:6] == ["P", "K", "003", "004", "\\0", "\\0"]


def test_text_shows_what_its_bytes_hold(conform: Conformance) -> None:
    """Bidirectional controls are shown as markers; a progress bar shows its last frame;
    escape sequences go and the text around them stays (C1 DCS, OSC ended by U+009C)."""
    command = (
        r"printf 'role != \"user\342\200\256 \342\201\246// admin\342\201\251\"\n'; "
        r"printf '10%%\r60%%\r100%%\n'; "
        r"printf 'important\302\220data \033]8;;http://x/\302\234link\033]8;;\302\234\n'"
    )
    text = bash(conform, {"command": command})
    assert text.text.endswith(
        '\n\nstdout:\nrole != "user<U+202E> <U+2066>// admin<U+2069>"\n100%\n'
        "importantdata link"
    ), text.text


def test_a_minified_line_is_cut_to_2000_characters(conform: Conformance) -> None:
    """One long line cannot fill the budget: it is cut to 2,000 characters and counted,
    and the output after it is shown."""
    text = bash(conform, {"command": "python3 -c \"print('y' * 100000); print('done')\""})
    call_id = conform.fleet.last.call_id
    expected = (
        "\n\nstdout:\n" + "y" * 2000 + "… [98,000 more characters]\ndone\n"
        r"[stdout cut: showing the last 2 of 2 lines (2034 of 100006 bytes); 1 line cut to "
        rf"2,000 characters. Full output: bash_output id={call_id} ("
    )
    assert expected in text.text, text.text[-400:]
    assert conform.read_all(call_id) == "y" * 100000 + "\ndone\n"
