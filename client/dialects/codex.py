"""The `codex` dialect: `exec_command` and `write_stdin`, OpenAI Codex CLI's unified exec.

As the Codex CLI runs it: `exec_command` starts a command (a PTY with `tty: true`, else
plain pipes with stdin closed) and waits `yield_time_ms` (clamped to 250..30000) or until
it exits; still running, it is a *session* whose integer id (1000..99999) `write_stdin`
takes: it writes `chars` (through the terminal: `\\u0003` is Ctrl-C), waits 100 ms, then
up to `yield_time_ms` (default 250; an empty poll is clamped to 5000..30000), and returns
the output produced since the last return. A process that waits for input (blocked reading
its terminal, no output for 2 s) ends the wait early, and the result says so: nothing
waits for input silently.

Session ids belong to the agent's session (`SessionState.exec_sessions`, in Redis for
the MCP server): a second server process of the same `--session` writes to a process
the first one started, on whichever host runs it. At most 64 live sessions: starting
another prunes (ends) the least recently used, never one of the 8 most recent; from 60
on, results warn. Every process gets `NO_COLOR=1`, `TERM=dumb`, `LC_ALL=C.UTF-8`,
`PAGER=cat`.

Result text (sections joined by single newlines):

    Chunk ID: 3f9a1c
    Wall time: 1.0024 seconds
    Process running with session ID 32244
    Original token count: 63
    Output:
    <output>

`Process exited with code N` instead once it ended (128+N for signal N). Output past
`max_output_tokens` (×4 bytes) keeps its head and tail halves around
`…N tokens truncated…` and is prefixed with `Total output lines: N` and a blank line.
Added when it applies, after the process line: `Process is waiting for input after
printing: ">>> "` and the 60-session warning.
"""

from __future__ import annotations

import json
import random
import secrets
import time
from collections.abc import Callable, Mapping

from bashfleet.client.dialects._text import shell_status, system_failure
from bashfleet.client.dialects.args import ArgError, Args, command_problem, path_problem
from bashfleet.client.dialects.base import (
    Dialect,
    ExecSession,
    GuardedRunner,
    Handler,
    RefusalError,
    RunnerError,
    SessionState,
    ToolSpec,
    ToolText,
)
from bashfleet.client.errors import UnknownJob
from bashfleet.worker.wire.control import Collect, KillRequest, SessionOutput, WriteStdinRequest
from bashfleet.worker.wire.models import (
    CallResult,
    HeadTailTokens,
    InputWait,
    Policy,
    RunRequest,
    TruncationInfo,
)

#: Codex's defaults and clamps.
EXEC_YIELD_MS = 10_000
WRITE_YIELD_MS = 250
MIN_YIELD_MS = 250
MAX_YIELD_MS = 30_000
MIN_POLL_MS = 5_000
MAX_OUTPUT_TOKENS = 10_000
#: Pause after a non-empty write before output is collected.
WRITE_SETTLE_S = 0.1
#: Session ids are random integers in this range.
SESSION_ID_RANGE = (1000, 99_999)
#: Live sessions per agent; the most recent that pruning spares; when warnings start.
MAX_SESSIONS = 64
PROTECTED_RECENT = 8
WARN_SESSIONS = 60
#: Seconds blocked on input without output before the process counts as waiting.
INPUT_WAIT_S = 2.0
#: What every process gets (a tty session may set its own TERM).
FORCED_ENV = {"NO_COLOR": "1", "TERM": "dumb", "LC_ALL": "C.UTF-8", "PAGER": "cat"}

PIPE_REFUSAL = "stdin is closed for this session; rerun exec_command with tty=true"

EXEC_DESCRIPTION = (
    "Runs a command in a PTY, returning output or a session ID for ongoing interaction."
)
WRITE_DESCRIPTION = (
    "Writes characters to an existing unified exec session and returns recent output."
)

# The two properties both tools share, word for word (Codex's schemas).
_OUTPUT_PROPERTIES = {
    "yield_time_ms": {
        "type": "number",
        "description": "How long to wait (in milliseconds) for output before yielding.",
    },
    "max_output_tokens": {
        "type": "number",
        "description": "Maximum number of tokens to return. Excess output will be truncated.",
    },
}

EXEC_SCHEMA = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string", "description": "Shell command to execute."},
        "workdir": {
            "type": "string",
            "description": "Optional working directory to run the command in; defaults to "
            "the turn cwd.",
        },
        "shell": {
            "type": "string",
            "description": "Shell binary to launch. Defaults to the user's default shell.",
        },
        "tty": {
            "type": "boolean",
            "description": "Whether to allocate a TTY for the command. Defaults to false "
            "(plain pipes); set to true to open a PTY and access TTY process.",
        },
        "login": {
            "type": "boolean",
            "description": "Whether to run the shell with -l/-i semantics. Defaults to true.",
        },
        **_OUTPUT_PROPERTIES,
    },
    "required": ["cmd"],
    "additionalProperties": False,
}
WRITE_SCHEMA = {
    "type": "object",
    "properties": {
        "session_id": {
            "type": "number",
            "description": "Identifier of the running unified exec session.",
        },
        "chars": {
            "type": "string",
            "description": "Bytes to write to stdin (may be empty to poll).",
        },
        **_OUTPUT_PROPERTIES,
    },
    "required": ["session_id"],
    "additionalProperties": False,
}


def clamp_yield(value: float | None, default: int, *, poll: bool = False) -> int:
    """`yield_time_ms` as Codex clamps it: 250..30000, an empty poll 5000..30000."""
    wanted = default if value is None else int(value)
    low = MIN_POLL_MS if poll else MIN_YIELD_MS
    return max(low, min(MAX_YIELD_MS, wanted))


def output_tokens(value: float | None) -> int:
    """`max_output_tokens`, default 10000, never negative."""
    return MAX_OUTPUT_TOKENS if value is None else max(0, int(value))


def original_tokens(info: TruncationInfo | None, text: str) -> int:
    """Tokens of the output before truncation: its bytes over 4, rounded up."""
    size = info.total_bytes if info is not None else len(text.encode("utf-8"))
    return -(-size // 4)


def shown_output(text: str, info: TruncationInfo | None) -> str:
    """The output as shown: a truncated one gets its `Total output lines` header."""
    if info is not None and info.truncated:
        return f"Total output lines: {info.total_lines}\n\n{text}"
    return text


def chunk_id(rng: Callable[[int], str] = secrets.token_hex) -> str:
    """6 random hex characters."""
    return rng(3)


def render(
    *, chunk: str, wall_s: float, exit_code: int | None, session_id: int | None,
    output: str, info: TruncationInfo | None, waiting: InputWait | None = None,
    warning: str | None = None,
) -> str:
    """The result text of both tools."""
    lines = [f"Chunk ID: {chunk}", f"Wall time: {wall_s:.4f} seconds"]
    if session_id is not None:
        lines.append(f"Process running with session ID {session_id}")
    else:
        lines.append(f"Process exited with code {exit_code if exit_code is not None else -1}")
    if waiting is not None:
        lines.append(f"Process is waiting for input after printing: {json.dumps(waiting.prompt)}")
    if warning:
        lines.append(warning)
    lines.append(f"Original token count: {original_tokens(info, output)}")
    lines.append("Output:")
    lines.append(shown_output(output, info))
    return "\n".join(lines)


def prune(sessions: Mapping[int, ExecSession]) -> list[int]:
    """Session ids to end so one more fits under MAX_SESSIONS: least recently used first,
    never one of the PROTECTED_RECENT most recent."""
    excess = len(sessions) - MAX_SESSIONS + 1
    if excess <= 0:
        return []
    by_use = sorted(sessions, key=lambda sid: sessions[sid].last_used)
    candidates = by_use[: max(0, len(by_use) - PROTECTED_RECENT)]
    return candidates[:excess]


def warning_text(count: int) -> str | None:
    """The warning results carry from WARN_SESSIONS live sessions on."""
    if count < WARN_SESSIONS:
        return None
    return (f"Warning: {count} unified exec sessions are open (at most {MAX_SESSIONS}; "
            "starting more ends the least recently used). End sessions you no longer need.")


class CodexDialect(Dialect):
    """Codex CLI's unified exec. `clock` (wall clock seconds) dates session use;
    `rng` draws session ids."""

    name = "codex"

    def __init__(
        self, clock: Callable[[], float] = time.time, rng: random.Random | None = None
    ) -> None:
        self._clock = clock
        self._rng = rng or random.SystemRandom()

    def policy(self, max_tokens: int = MAX_OUTPUT_TOKENS) -> Policy:
        """Combined output, head and tail halves of `max_tokens`, processes left running."""
        return Policy(
            name=self.name, streams="combined", truncation=HeadTailTokens(max_tokens=max_tokens),
            default_timeout_s=EXEC_YIELD_MS / 1000, on_timeout="background",
        )

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """exec_command and write_stdin."""
        return [
            ToolSpec("exec_command", EXEC_DESCRIPTION, EXEC_SCHEMA),
            ToolSpec("write_stdin", WRITE_DESCRIPTION, WRITE_SCHEMA),
        ]

    def handlers(self) -> Mapping[str, Handler]:
        """One handler per tool."""
        return {"exec_command": self._exec, "write_stdin": self._write}

    def invalid(self, tool: str, message: str) -> ToolText:
        """Codex's own shape for arguments it cannot take."""
        return ToolText(f"failed to parse function arguments: {message}", is_error=True)

    def system_error(self, message: str) -> ToolText:
        """The fleet failed (not the command)."""
        return ToolText(f"exec error: {message}", is_error=True)

    # --------------------------------------------------------------------- exec_command

    def _exec(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        began = time.monotonic()
        command = args.text("cmd") or ""
        problem = command_problem(command) or path_problem("workdir", args.text("workdir") or "")
        if problem:
            raise ArgError(problem)
        tty = bool(args.flag("tty"))
        tokens = output_tokens(args.number("max_output_tokens"))
        yield_ms = clamp_yield(args.number("yield_time_ms"), EXEC_YIELD_MS)
        self._make_room(runner, session)
        result = runner.execute(RunRequest(
            command=command, host=session.host, timeout=yield_ms / 1000,
            cwd=args.text("workdir") or session.cwd, policy=self.policy(tokens),
            env={**session.env, **FORCED_ENV}, stdin="pty" if tty else "closed",
            shell=args.text("shell") or None,
            login=args.flag("login") if args.given("login") else True,
            input_wait_s=INPUT_WAIT_S,
        ))
        failure = system_failure(result)
        if failure is not None:
            return ToolText(f"exec_command failed: {failure.message}", is_error=True)
        return ToolText(self._started(command, tty, result, session, began))

    def _started(self, command: str, tty: bool, result: CallResult, session: SessionState,
                 began: float) -> str:
        session_id = None
        if result.backgrounded and result.job is not None:
            session_id = self._new_id(session)
            session.exec_sessions[session_id] = ExecSession(
                job_id=result.job.id, host=result.job.host, tty=tty, command=command,
                last_used=self._clock(),
            )
        return render(
            chunk=chunk_id(), wall_s=time.monotonic() - began,
            exit_code=shell_status(result.exit_code, result.signal), session_id=session_id,
            output=result.stdout, info=result.stdout_truncation, waiting=result.input_wait,
            warning=warning_text(len(session.exec_sessions)),
        )

    def _new_id(self, session: SessionState) -> int:
        while True:
            candidate = self._rng.randint(*SESSION_ID_RANGE)
            if candidate not in session.exec_sessions:
                return candidate

    def _make_room(self, runner: GuardedRunner, session: SessionState) -> None:
        """At the cap, end the least recently used sessions (their processes too)."""
        for session_id in prune(session.exec_sessions):
            entry = session.exec_sessions.pop(session_id)
            try:
                runner.kill_job(KillRequest(id=entry.job_id, signal=9))
            except RunnerError:
                continue  # ended already, or its host is gone: it is forgotten either way

    # ---------------------------------------------------------------------- write_stdin

    def _write(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        began = time.monotonic()
        number = args.number("session_id")
        session_id = int(number) if number is not None and number.is_integer() else None
        entry = session.exec_sessions.get(session_id) if session_id is not None else None
        if session_id is None or entry is None:
            shown = args.values.get("session_id")
            raise RefusalError(ToolText(f"Unknown session id {shown}", is_error=True))
        chars = args.text("chars") or ""
        if chars and not entry.tty:
            raise RefusalError(ToolText(PIPE_REFUSAL, is_error=True))
        tokens = output_tokens(args.number("max_output_tokens"))
        yield_ms = clamp_yield(args.number("yield_time_ms"), WRITE_YIELD_MS, poll=not chars)
        collect = Collect(
            wait_s=yield_ms / 1000, delay_s=WRITE_SETTLE_S if chars else 0.0,
            input_wait_s=INPUT_WAIT_S, truncation=HeadTailTokens(max_tokens=tokens),
        )
        try:
            out = runner.write_stdin_request(
                WriteStdinRequest(id=entry.job_id, data=chars, collect=collect))
        except RunnerError as exc:
            if isinstance(exc.__cause__, UnknownJob):
                del session.exec_sessions[session_id]
                raise RefusalError(ToolText(f"Unknown session id {session_id}",
                                            is_error=True)) from exc
            raise
        return ToolText(self._written(session_id, entry, out, session, began))

    def _written(self, session_id: int, entry: ExecSession, out: SessionOutput,
                 session: SessionState, began: float) -> str:
        if out.running:
            entry.last_used = self._clock()
            session.exec_sessions[session_id] = entry
        else:
            session.exec_sessions.pop(session_id, None)
        return render(
            chunk=chunk_id(), wall_s=time.monotonic() - began,
            exit_code=shell_status(out.exit_code, out.signal),
            session_id=session_id if out.running else None, output=out.output,
            info=out.output_truncation, waiting=out.input_wait,
            warning=warning_text(len(session.exec_sessions)),
        )
