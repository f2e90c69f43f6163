"""The `native` dialect: bashfleet's own tools, `bash`, `bash_check`, `bash_kill` and
`bash_output`.

Everything the engine knows, said plainly: how the command ended (exit code, signal,
timeout, backgrounded job and its host), both streams apart, exact counts of every cut
and how to read the rest (the `bash_output` call that reads it, and the file on its
host: a hint names a tool the model has, never a command its calls could not run), the error
lines found in the part that was cut, and after a timeout the call's processes (pid,
state, CPU seconds, command) and how long ago it last printed.

The text shown is the text the bytes hold, and no more than a model can use: binary
output (a NUL byte, or mostly invalid UTF-8, in its first 8 KiB) is reported by its size
and where it is kept, not shown as cleaned-up garbage; bidirectional and zero-width
characters show as `<U+202E>` markers (the "Trojan Source" class); a line rewritten with
carriage returns (a progress bar) shows its last frame; a line longer than 2,000
characters is cut there (`… [N more characters]`) and counted in the cut notice.

A named `session` is a fleet session (`bashfleet.client.shells`): a shell that lives on in Redis
between calls, whoever makes them (another agent, `bashfleet run --session NAME`). Each
call of it reports the state it ended in (`cwd_after`, exported and unset variables) and
the next one starts there, on the same host; an explicit `cwd` holds for its call only.
Without a session, calls are stateless. Notes say only what changed (tokens count on
every call): the session's line comes when the call moved its directory or exported or
unset a variable. A command the session already ran in the last 10 minutes, whose
output was cut (or went on as a job), gets a note saying which call ran it and where its
output is, so a model that only wants the part that was cut can read it instead of
running again; a rerun whose earlier output was shown whole gets none.

    exit code: 2
    host build-3 · call c0ffee · 41.20s · cwd /src/app

    stdout:
    ...
    [stdout cut: showing the last 2000 of 8500 lines (51200 of 402112 bytes, lines limit).
    Full output: bash_output id=c0ffee (/var/.../c0ffee.out on host build-3)]

    stderr:
    ...
    [stderr cut: showing the last 3 of 3 lines (4120 of 901233 bytes); 1 line cut to
    2,000 characters. Full stderr: bash_output id=c0ffee stream=stderr
    (/var/.../c0ffee.err on host build-3)]

    error lines in the cut part:
      tests/test_x.py:12: AssertionError

    note: the same command ran in this session 2m 5s ago, as call c0ffee on host build-3
    (exit code 2); its full output: bash_output id=c0ffee (... on host build-3)

A binary stream:

    stdout:
    [binary output: 81920 bytes, saved to /var/.../c0ffee.out on host build-3]

`bash_output` id=c0ffee:

    c0ffee stdout: bytes 0-51200 of 402112 (/var/.../c0ffee.out)

    ...

    next: bash_output id=c0ffee offset=51200
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping

from bashfleet.client.dialects._text import (
    activity,
    chomp,
    count_lines,
    cut_summary,
    seconds,
    signal_label,
    system_failure,
    without_completion_line,
)
from bashfleet.client.dialects.args import ArgError, Args, command_problem, path_problem
from bashfleet.client.dialects.base import (
    Dialect,
    GuardedRunner,
    Handler,
    RunRecord,
    SessionState,
    ToolSpec,
    ToolText,
)
from bashfleet.worker.wire.control import (
    MAX_COLLECT_WAIT_S,
    CheckRequest,
    Collect,
    KillRequest,
    ReadOutputRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import (
    MAX_TIMEOUT_S,
    CallResult,
    CheckResult,
    InputWait,
    OutputChunk,
    Policy,
    RunRequest,
    Spill,
    TailLines,
    TruncationInfo,
)
from bashfleet.worker.wire.names import valid_id

DEFAULT_TIMEOUT_S = 120.0
SLOW_TIMEOUT_S = 15 * 60.0
#: A command sent again within this many seconds gets the "already ran" hint.
RERUN_WINDOW_S = 10 * 60.0
#: Most runs a session remembers for that hint.
HISTORY_SIZE = 20
#: Longest line shown, in characters: one minified line cannot fill the 50 KB budget.
MAX_LINE_CHARS = 2000
#: Bytes of kept output one `bash_output` call returns (the budget of one `bash` call).
OUTPUT_SLICE_BYTES = 51_200
#: Most ended jobs one result tells of (the others are told on the next ones).
MAX_JOB_NEWS = 10

BASH_DESCRIPTION = """\
Run a bash command on a bashfleet worker: `bash -c`, no TTY, empty stdin, its own process \
group. stdout and stderr are shown apart, each cut to its last 2000 lines or 50KB with exact \
counts, the error lines of the cut part, and where the full output is kept. Lines over 2,000 \
characters are cut, a progress bar shows its last frame, and binary output is reported by size.

mode: default (timeout 120s unless given; a command still running then keeps running as a \
background job), slow (15 minutes), background (start a job and return at once).
host: the worker to run on (default: any). session: a fleet session that keeps cwd and \
environment between calls and stays on one host."""

CHECK_DESCRIPTION = """\
Show a background job's state and the output it printed since the last check (or since \
byte `offset`). `grep` keeps only the lines matching a regular expression."""

OUTPUT_DESCRIPTION = """\
Read the full output a call or job kept on its host (what a cut notice points to), 50KB \
at a time from byte `offset` (default 0): `id` is the call id or job id the notice names; \
`stream` stderr reads a call's separate stderr; `grep` keeps only the matching lines of \
the slice. The answer says where the next slice starts."""

KILL_DESCRIPTION = """\
Stop a background job: SIGTERM to its process group, SIGKILL after a grace period, then \
every process it started, even those that left the group. Shows its final output."""

BASH_SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The command, run as bash -c COMMAND"},
        "mode": {
            "type": "string",
            "enum": ["default", "slow", "background"],
            "description": "default (120s, then background), slow (15 min) or background",
        },
        "timeout": {
            "type": "number",
            "description": "Seconds before the command is backgrounded (default 120)",
        },
        "cwd": {"type": "string", "description": "Working directory on the worker"},
        "host": {"type": "string", "description": "Host id of the worker to run on"},
        "session": {
            "type": "string",
            "description": "Fleet session id: cwd, environment and host carried between calls "
            "(not a background job's changes)",
        },
        "stdin": {
            "type": "boolean",
            "description": "Keep stdin open as a pipe: bash_write sends it input",
        },
        "tty": {
            "type": "boolean",
            "description": "Run in a terminal (PTY): prompts, REPLs, Ctrl-C through bash_write",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}
CHECK_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "Job id"},
        "grep": {"type": "string", "description": "Regular expression: show only matching lines"},
        "offset": {
            "type": "integer",
            "description": "Byte offset to read from (default: where the last check stopped)",
        },
    },
    "required": ["id"],
    "additionalProperties": False,
}
OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "Call id or job id"},
        "offset": {
            "type": "integer",
            "minimum": 0,
            "description": "Byte offset to read from (default 0)",
        },
        "stream": {
            "type": "string",
            "enum": ["stdout", "stderr"],
            "description": "stdout (default) or a call's separate stderr",
        },
        "grep": {"type": "string", "description": "Regular expression: only matching lines"},
    },
    "required": ["id"],
    "additionalProperties": False,
}

WRITE_DESCRIPTION = """\
Send input to a job started with stdin or tty (a REPL, a prompt, a dev server), then show \
what it printed since the last look. Through a terminal, \\u0003 is Ctrl-C and \\n is Enter. \
Waits until its output settles, it waits for input again, or it ends (at most `timeout` \
seconds, default 10). `close` ends its input (EOF) after the text."""

WRITE_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "Job id"},
        "input": {"type": "string", "description": "Text to send (empty: just read)"},
        "close": {"type": "boolean", "description": "End the input (EOF) after the text"},
        "timeout": {"type": "number", "description": "Most seconds to wait (default 10)"},
    },
    "required": ["id"],
    "additionalProperties": False,
}
#: How long bash_write waits at most, and how long output must stay quiet to count as done.
WRITE_TIMEOUT_S = 10.0
WRITE_SETTLE_S = 0.3
#: Seconds blocked on input without output before a process counts as waiting.
INPUT_WAIT_S = 2.0

KILL_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string", "description": "Job id"}},
    "required": ["id"],
    "additionalProperties": False,
}


def _signal_text(number: int) -> str:
    return f"{signal_label(number)} ({number})"


def _ending(exit_code: int | None, signal_number: int | None) -> str:
    if exit_code is not None:
        return f"exited with code {exit_code}"
    if signal_number is not None:
        return f"killed by signal {_signal_text(signal_number)}"
    return "ended, exit status unknown"


def _where(path: str, host: str, error: str | None = None) -> str:
    text = f"{path} on host {host}"
    return text + (f", may be incomplete: {error}" if error else "")


def _lines(count: int) -> str:
    return f"{count} line" if count == 1 else f"{count} lines"


def _long_lines_phrase(info: TruncationInfo) -> str:
    """`; 3 lines cut to 2,000 characters`, when the width cap cut any shown line."""
    if not info.long_lines_cut:
        return ""
    return f"; {_lines(info.long_lines_cut)} cut to {MAX_LINE_CHARS:,} characters"


def _binary_notice(
    info: TruncationInfo, path: str | None, result: CallResult, spill: Spill | None
) -> str:
    """`[binary output: N bytes, saved to <file> on host <host>]`: a binary stream is
    reported by its size and where its bytes are, never shown."""
    if path is None:
        reason = spill.error if spill is not None and spill.error else "no spill file"
        return f"[binary output: {info.total_bytes} bytes, not kept: {reason}]"
    host, error = (spill.host, spill.error) if spill else (result.host, None)
    return f"[binary output: {info.total_bytes} bytes, saved to {_where(path, host, error)}]"


def _grep_problem(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"grep is not a valid regular expression: {exc}"
    return None


def _activity_block(result: CallResult) -> str:
    """What a timed-out call was running (still, or until killed) and its last output."""
    found = activity(result)
    if found is None:
        return ""
    processes, age = found
    heading = "processes still running:" if result.backgrounded else "processes at the timeout:"
    lines = [heading, *(f"  {p}" for p in processes)] if processes else []
    return "\n".join([*lines, age])


def _ago(seconds_ago: float) -> str:
    """`45s`, `3m 2s`: how long ago, to the second."""
    whole = int(seconds_ago)
    return f"{whole}s" if whole < 60 else f"{whole // 60}m {whole % 60}s"


def _already_ran(earlier: RunRecord, now: float) -> str | None:
    """The hint that the same command ran moments ago and where its output is; None when
    it would not help: the earlier output was shown whole (nothing more to read), so the
    run is a rerun the model meant (tests again after an edit), and every token of a note
    on every such call is wasted."""
    if earlier.job_id is None and earlier.spill_path is None:
        return None
    if earlier.exit_code is not None:
        ended = f"exit code {earlier.exit_code}"
    elif earlier.signal is not None:
        ended = f"killed by signal {_signal_text(earlier.signal)}"
    else:
        ended = "no exit status"
    text = (
        f"note: the same command ran in this session {_ago(now - earlier.at)} ago, as call "
        f"{earlier.call_id} on host {earlier.host} ({ended})"
    )
    if earlier.job_id is not None:
        return text + f"; it went on as job {earlier.job_id}: bash_check id={earlier.job_id}"
    where = _where(earlier.spill_path or "", earlier.host)
    return text + f"; its full output: bash_output id={earlier.call_id} ({where})"


def _shell_report(name: str, result: CallResult) -> str | None:
    """What the call changed in the named session: the directory it moved to (where the
    next call starts), the variables it exported or unset. None when it changed nothing
    (a job's changes are never kept: its end comes after later calls), so a call that
    only ran says nothing about the session."""
    changes = []
    if result.cwd_after and result.cwd_after != result.cwd:
        changes.append(f"ended in {result.cwd_after}; its next call starts there")
    if result.env_changes:
        changes.append("exported: " + ", ".join(sorted(result.env_changes)))
    if result.env_removed:
        changes.append("unset: " + ", ".join(result.env_removed))
    return f"session {name}: " + "; ".join(changes) if changes else None


def job_news(runner: GuardedRunner, session: SessionState) -> str | None:
    """The jobs of this session that ended and the model was not told of yet (at most
    MAX_JOB_NEWS lines), each marked told; one round trip to Redis, no worker asked."""
    untold = [job.id for job in session.jobs.values() if not job.end_told and not job.killed]
    ended = [view for view in runner.job_views(untold).values() if view.state == "ended"]
    if not ended:
        return None
    lines = []
    for view in sorted(ended, key=lambda v: v.ended_at or 0.0):
        session.jobs[view.id].end_told = True
        took = f" after {view.ended_at - view.started_at:.1f}s" if view.ended_at else ""
        command = view.command if len(view.command) <= 60 else view.command[:57] + "..."
        lines.append(
            f"  job {view.id} ({command}): {_ending(view.exit_code, view.signal)}{took}; "
            f"output: {_where(view.output_path, view.host)} (bash_check id={view.id} reads it)"
        )
    more = len(lines) - MAX_JOB_NEWS
    shown = lines[:MAX_JOB_NEWS] + ([f"  ... and {more} more"] if more > 0 else [])
    return "background jobs that ended since your last call:\n" + "\n".join(shown)


def session_status(job_id: str, host: str, stdin: str, waiting: InputWait | None) -> str:
    """The first line of a running interactive job: where it runs, what it waits for."""
    kind = {"pty": "a terminal", "pipe": "stdin as a pipe"}.get(stdin, "no stdin")
    text = f"running as job {job_id} on host {host} with {kind}"
    if waiting is not None:
        text += (f"; WAITING FOR INPUT (blocked reading it for {waiting.idle_s:.1f}s, "
                 f"pid {waiting.pid}) after printing: {json.dumps(waiting.prompt)}")
    return text



class NativeDialect(Dialect):
    """bashfleet's own tools.

    `clock` (wall clock seconds) dates the session's runs for the "already ran" hint.
    """

    name = "native"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    def policy(self) -> Policy:
        """Separate streams, tail 2000 lines / 50 KB with an error digest, 120 s then
        background; binary detection, visible invisibles, last frames, 2,000-character lines."""
        return Policy(
            name=self.name,
            streams="separate",
            truncation=TailLines(max_lines=2000, max_bytes=51_200),
            digest_errors=True,
            default_timeout_s=DEFAULT_TIMEOUT_S,
            on_timeout="background",
            detect_binary=True,
            reveal_invisible=True,
            last_frame=True,
            max_line_chars=MAX_LINE_CHARS,
        )

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """bash, bash_check, bash_kill, bash_output."""
        return [
            ToolSpec("bash", BASH_DESCRIPTION, BASH_SCHEMA),
            ToolSpec("bash_check", CHECK_DESCRIPTION, CHECK_SCHEMA),
            ToolSpec("bash_kill", KILL_DESCRIPTION, KILL_SCHEMA),
            ToolSpec("bash_output", OUTPUT_DESCRIPTION, OUTPUT_SCHEMA),
            ToolSpec("bash_write", WRITE_DESCRIPTION, WRITE_SCHEMA),
        ]

    def handlers(self) -> Mapping[str, Handler]:
        """One handler per tool; each result also says which of the session's background
        jobs ended since the last call (`_with_job_news`)."""
        return {
            "bash": self._with_job_news(self._bash),
            "bash_check": self._with_job_news(self._check),
            "bash_kill": self._with_job_news(self._kill),
            "bash_output": self._with_job_news(self._output),
            "bash_write": self._with_job_news(self._write),
        }

    @staticmethod
    def _with_job_news(handler: Handler) -> Handler:
        def serve(args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
            text = handler(args, runner, session)
            news = job_news(runner, session)
            return ToolText(f"{text.text}\n\n{news}", is_error=text.is_error) if news else text

        return serve

    # ---------------------------------------------------------------------------- bash

    def _bash(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        command = args.text("command") or ""
        problem = command_problem(command) or path_problem("cwd", args.text("cwd") or "")
        if problem:
            raise ArgError(problem)
        timeout = args.number("timeout")
        if timeout is not None and not 0 < timeout <= MAX_TIMEOUT_S:
            raise ArgError(f"timeout must be above 0 and at most {MAX_TIMEOUT_S:g} seconds")
        mode = args.text("mode") or "default"
        stdin = "pty" if args.flag("tty") else "pipe" if args.flag("stdin") else "null"
        interactive = stdin != "null"
        name = args.text("session") or None
        if name is not None and not valid_id(name):
            raise ArgError(f"session must be 1-64 letters, digits, '.', '_' or '-', not {name!r}")
        cwd = args.text("cwd") or None
        sent_at = self._clock()
        result = runner.execute(RunRequest(
            command=command,
            # A named session is a fleet session: its own pin, cwd and variables (in
            # Redis, shared with every caller of it), filled in by the fleet.
            host=args.text("host") or (None if name else session.host),
            mode=mode,
            timeout=timeout,
            cwd=cwd or (None if name else session.cwd),
            default_cwd=session.cwd if name else None,
            session=name,
            policy=self.policy(),
            env=dict(session.env),
            stdin=stdin, input_wait_s=INPUT_WAIT_S if interactive else None,
        ))
        text = self.render_run(result, mode, timeout)
        if system_failure(result) is not None:
            return text  # nothing ran: nothing to remember
        notes = self._remember(command, result, session, sent_at)
        report = _shell_report(name, result) if name is not None else None
        if report is not None:
            notes.insert(0, report)
        return ToolText("\n\n".join([text.text, *notes]), is_error=text.is_error)

    def _remember(
        self, command: str, result: CallResult, session: SessionState, sent_at: float
    ) -> list[str]:
        """Keep what the run taught the session; the notes that tell the model about it."""
        notes = []
        if result.job is not None:
            stderr_path = result.spill.stderr_path if result.spill else None
            session.remember(result.job, command, stderr_path=stderr_path)
            # The output shown here is the first look: bash_check reads on after it.
            session.shown_until(result.job.id, result)
        earlier = self._earlier_run(command, session, sent_at)
        self._record(command, result, session, sent_at)
        hint = _already_ran(earlier, sent_at) if earlier is not None else None
        if hint is not None:
            notes.append(hint)
        return notes

    def _earlier_run(self, command: str, session: SessionState, now: float) -> RunRecord | None:
        """The latest run of the same command in this session within the hint window."""
        for record in reversed(session.history):
            if record.command == command and 0 <= now - record.at <= RERUN_WINDOW_S:
                return record
        return None

    def _record(
        self, command: str, result: CallResult, session: SessionState, sent_at: float
    ) -> None:
        """Remember this run; keep only the latest runs of the hint window."""
        spill = result.spill
        session.history.append(
            RunRecord(
                command=command,
                call_id=result.call_id,
                host=result.host,
                at=sent_at,
                exit_code=result.exit_code,
                signal=result.signal,
                spill_path=spill.stdout_path if spill else None,
                job_id=result.job.id if result.job else None,
            )
        )
        recent = [r for r in session.history if sent_at - r.at <= RERUN_WINDOW_S]
        session.history = recent[-HISTORY_SIZE:]

    def render_run(self, result: CallResult, mode: str, timeout: float | None) -> ToolText:
        """How the call ended, its streams, counts, digest, live processes."""
        where = f"host {result.host} · call {result.call_id} · {result.duration_s:.2f}s"
        if result.cwd:
            where += f" · cwd {result.cwd}"
        failure = system_failure(result)
        if failure is not None:
            text = f"system error ({failure.kind}): {failure.message}\n{where}"
            return ToolText(text, is_error=True)
        if timeout is None:
            timeout = SLOW_TIMEOUT_S if mode == "slow" else DEFAULT_TIMEOUT_S
        job = result.job
        if job is not None and job.stdin != "null" and result.backgrounded:
            status, failed = session_status(job.id, job.host, job.stdin, result.input_wait), False
        elif job is not None and job.stdin != "null":
            # An interactive command that ended within its wait: ended like any call.
            status, failed = self._status(result.model_copy(update={"job": None}), timeout)
        else:
            status, failed = self._status(result, timeout)
        blocks = [f"{status}\n{where}", *self._streams(result)]
        if result.error_digest:
            lines = "\n".join(f"  {line}" for line in result.error_digest)
            blocks.append(f"error lines in the cut part:\n{lines}")
        doing = _activity_block(result)
        if doing:
            blocks.append(doing)
        if job is not None and result.backgrounded and job.stdin != "null":
            blocks.append(f"bash_write id={job.id} sends input and shows new output; "
                          f"bash_kill id={job.id} stops it.")
        elif job is not None and job.stdin == "null":
            blocks.append(f"bash_check id={job.id} shows its output; "
                          f"bash_kill id={job.id} stops it.")
        if result.network_denied:
            blocks.append("network: this workspace's policy refused "
                          + ", ".join(result.network_denied))
        if result.error is not None:
            blocks.append(f"warning: {result.error.message}")
        return ToolText("\n\n".join(blocks), is_error=failed)

    def _status(self, result: CallResult, timeout: float) -> tuple[str, bool]:
        """The first line, and whether the call counts as failed."""
        job = result.job
        if job is not None and result.timed_out:
            return (
                f"timed out after {seconds(timeout)}; still running in background as job "
                f"{job.id} on host {job.host} (pid {job.pid})"
            ), False
        if job is not None:
            return (
                f"started in background as job {job.id} on host {job.host} "
                f"(pid {job.pid}, pgid {job.pgid}); output: {job.output_path}"
            ), False
        if result.timed_out:
            how = f" by signal {_signal_text(result.signal)}" if result.signal is not None else ""
            return f"timed out after {seconds(timeout)}; killed{how}", True
        if result.exit_code is not None:
            return f"exit code: {result.exit_code}", result.exit_code != 0
        if result.signal is not None:
            return f"killed by signal {_signal_text(result.signal)}", True
        return "ended, exit status unknown", True

    def _streams(self, result: CallResult) -> list[str]:
        spill = result.spill
        out_path = spill.stdout_path if spill else None
        err_path = spill.stderr_path if spill else None
        streams = (
            ("stdout", result.stdout, result.stdout_truncation, out_path),
            ("stderr", result.stderr, result.stderr_truncation, err_path),
        )
        blocks = []
        for name, text, info, path in streams:
            cut = info is not None and info.truncated
            if not text and not cut:
                continue
            if info is not None and info.binary:
                blocks.append(f"{name}:\n{_binary_notice(info, path, result, spill)}")
                continue
            block = f"{name}:\n{chomp(text)}"
            if info is not None and cut:
                block += "\n" + self._notice(name, info, path, result, spill)
            blocks.append(block)
        if not blocks and result.job is None:
            blocks.append("(no output)")
        return blocks

    def _notice(
        self,
        name: str,
        info: TruncationInfo,
        path: str | None,
        result: CallResult,
        spill: Spill | None,
    ) -> str:
        summary = cut_summary(info) + _long_lines_phrase(info)
        if path is None:
            return f"[{name} cut: {summary}. The full output was not kept.]"
        host, error = (spill.host, spill.error) if spill else (result.host, None)
        location = _where(path, host, error)
        if name == "stdout":
            rest = f"Full output: bash_output id={result.call_id} ({location})"
        else:
            rest = f"Full stderr: bash_output id={result.call_id} stream=stderr ({location})"
        return f"[{name} cut: {summary}. {rest}]"

    # -------------------------------------------------------------------- check / kill

    def _check(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        job_id = args.text("id") or ""
        grep = args.text("grep") or None
        offset = args.integer("offset")
        if offset is not None and offset < 0:
            raise ArgError(f"offset must be 0 or more, not {offset}")
        problem = _grep_problem(grep) if grep else None
        if problem:
            raise ArgError(problem)
        start = offset if offset is not None else session.offsets.get(job_id, 0)
        # An explicit offset rereads stdout; stderr then goes on from the job's last check.
        err_start = None if offset is not None else session.stderr_offsets.get(job_id, 0)
        result = runner.check_job(
            CheckRequest(id=job_id, grep=grep, offset=start, stderr_offset=err_start)
        )
        session.offsets[job_id] = result.offset
        session.stderr_offsets[job_id] = result.stderr_offset
        if not result.running and job_id in session.jobs:
            session.jobs[job_id].end_told = True
        return self.render_check(result, start, grep)

    def render_check(self, result: CheckResult, start: int, grep: str | None) -> ToolText:
        """A job's state and its new output."""
        state = "running" if result.running else _ending(result.exit_code, result.signal)
        blocks = [f"job {result.id} on host {result.host}: {state}"]
        matching = f" matching {grep!r}" if grep else ""
        blocks.extend(self._job_output(result, f"output since byte {start}{matching}"))
        blocks.append(
            f"next offset: {result.offset} (bash_check id={result.id} continues from there)"
        )
        return ToolText("\n\n".join(blocks))

    def _job_output(self, result: CheckResult, label: str) -> list[str]:
        # The status line says how it ended: the engine's completion line would repeat it.
        result = without_completion_line(result)
        blocks = []
        info = result.output_truncation
        if result.output:
            total = info.total_lines if info is not None else count_lines(result.output)
            block = f"{label} ({_lines(total)}):\n{chomp(result.output)}"
            if info is not None and info.truncated:
                location = _where(result.output_path, result.host)
                block += (
                    f"\n[output cut: {cut_summary(info)}. "
                    f"Full output: bash_output id={result.id} ({location})]"
                )
            blocks.append(block)
        else:
            blocks.append(f"{label}: none")
        if result.stderr_output:
            blocks.append(f"stderr:\n{chomp(result.stderr_output)}")
        if result.note:
            blocks.append(f"note: {result.note}")
        return blocks

    # ----------------------------------------------------------------------- bash_write

    def _write(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        job_id = args.text("id") or ""
        timeout = args.number("timeout")
        if timeout is not None and not 0 <= timeout <= MAX_COLLECT_WAIT_S:
            raise ArgError(f"timeout must be 0 to {MAX_COLLECT_WAIT_S:g} seconds")
        collect = Collect(
            wait_s=WRITE_TIMEOUT_S if timeout is None else timeout, settle_s=WRITE_SETTLE_S,
            input_wait_s=INPUT_WAIT_S, truncation=self.policy().truncation,
        )
        out = runner.write_stdin_request(WriteStdinRequest(
            id=job_id, data=args.text("input") or "", close=bool(args.flag("close")),
            collect=collect,
        ))
        return self.render_write(out)

    def render_write(self, out: SessionOutput) -> ToolText:
        """A session's state and what it printed since the last look."""
        if out.running:
            state = session_status(out.id, out.host, out.stdin, out.input_wait)
        else:
            state = f"job {out.id} on host {out.host}: {_ending(out.exit_code, out.signal)}"
        blocks = [state]
        if out.written:
            blocks.append(f"sent {out.written} bytes")
        output = chomp(out.output)
        blocks.append(f"new output:\n{output}" if output else "new output: none")
        if out.output_truncation is not None and out.output_truncation.truncated:
            blocks.append(f"[output cut: {cut_summary(out.output_truncation)}. Full output: "
                          f"`bashfleet output {out.id}` ({_where(out.output_path, out.host)})]")
        if out.note:
            blocks.append(f"note: {out.note}")
        return ToolText("\n\n".join(blocks), is_error=not out.running and out.exit_code != 0)

    def _kill(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        job_id = args.text("id") or ""
        # Its final output: from where this session's last look stopped (a job this
        # session did not start: from the job's last check, by anyone).
        result = runner.kill_job(KillRequest(id=job_id, offset=session.offsets.get(job_id)))
        session.offsets[job_id] = result.offset
        job = session.jobs.get(job_id)
        if job is not None and not result.running:
            job.killed = True
        return self.render_kill(result)

    # ----------------------------------------------------------------------- output

    def _output(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        del session
        item = args.text("id") or ""
        offset = args.integer("offset") or 0
        if offset < 0:
            raise ArgError(f"offset must be 0 or more, not {offset}")
        grep = args.text("grep") or None
        problem = _grep_problem(grep) if grep else None
        if problem:
            raise ArgError(problem)
        stream = args.text("stream") or "stdout"
        chunk = runner.read_chunk(ReadOutputRequest(
            id=item, offset=offset, limit=OUTPUT_SLICE_BYTES, grep=grep,
            stream="stderr" if stream == "stderr" else "stdout",
        ))
        return self.render_output(item, stream, chunk, grep)

    def render_output(
        self, item: str, stream: str, chunk: OutputChunk, grep: str | None
    ) -> ToolText:
        """A slice of kept output, and where the next one starts."""
        matching = f", lines matching {grep!r}" if grep else ""
        head = (f"{item} {stream}: bytes {chunk.offset}-{chunk.next_offset} of {chunk.size}"
                f"{matching} ({chunk.path})")
        body = chomp(chunk.text) if chunk.text else "(nothing)"
        if chunk.eof:
            tail = "end of the output"
        else:
            extra = f" stream={stream}" if stream != "stdout" else ""
            tail = f"next: bash_output id={item}{extra} offset={chunk.next_offset}"
        return ToolText(f"{head}\n\n{body}\n\n{tail}")

    def render_kill(self, result: CheckResult) -> ToolText:
        """A killed job's end and final output."""
        if result.running:
            head = f"job {result.id} on host {result.host}: still running after the kill"
        else:
            ending = _ending(result.exit_code, result.signal)
            head = f"job {result.id} on host {result.host}: stopped; {ending}"
        blocks = [head, *self._job_output(result, "final output")]
        return ToolText("\n\n".join(blocks), is_error=result.running)
