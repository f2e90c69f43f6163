"""The `pi` dialect: `bash` {command, timeout, cwd, head, tail}, combined output.

The worker does pi's input handling when the policy asks: it lifts a trailing
`| head -n N` / `| tail -n N` into limits (explicit `head`/`tail` arguments win), and
refuses commands matching an interception rule whose suggested tool the agent has,
with `Blocked: ...` and the original command. Output keeps its last 50 KB (never
splitting a UTF-8 character, and from a whole line's start unless the last line alone is
larger); the full output is kept as an artifact.

Interception rules: pi's defaults live with the worker (`bashfleet.worker.engine.output.normalize`),
which the client may not import, so this dialect takes its rules as a constructor argument and
has none by default; whoever builds the dialect for a pi agent passes the rules and the
agent's tool names (`PiDialect(intercept=rules, available_tools=("read", "grep", ...))`).

Result text, as pi's `BashTool` shapes it:
- the output (head/tail applied), `(no output)` when empty. `head` is the first lines of
  the whole output and `tail` its last (head first, then tail of what head kept), read
  from the full output wherever they are, not from the 50 KB tail kept in view
  (`seq 1 100000` with `head: 3` shows 1, 2, 3);
- when the output was larger than 50 KB (as pi's output sink, which then keeps the
  artifact): `\\n\\n[Showing lines A-B of T (50.0KB limit). Full: artifact://<id>]`,
  the lines shown exactly (`(50.0KB limit)` only when that limit cut what is shown). The
  artifact id is the call id: the full output is the call's spill file on the host that
  ran it. The session lists it, and the MCP server serves it as a resource
  (`resources/list`, `resources/read` of `artifact://<id>`), read through the fleet;
- errors (`is_error`): the output then `\\n\\nCommand exited with code N`, or
  `\\n\\nCommand failed: missing exit status` (ended by a signal); cwd and block errors
  are the worker's own messages (`Working directory does not exist: ...`, `Blocked: ...`);
- a timeout: `[Command timed out after N seconds]` on the first line, then the partial
  output; a cancelled call: `[Command cancelled]`, then the output. Pi's executor
  maps both to an annotation that `OutputSink.dump` puts before the output
  (`[notice]\\n` + output), and the tool throws that text.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping, Sequence

from bashfleet.client.dialects.args import ArgError, Args, command_problem, path_problem
from bashfleet.client.dialects.base import (
    Artifact,
    Dialect,
    GuardedRunner,
    Handler,
    SessionState,
    ToolSpec,
    ToolText,
)
from bashfleet.worker.wire.models import (
    ByteTail,
    CallResult,
    InterceptRule,
    Policy,
    RunRequest,
    TruncationInfo,
)

DESCRIPTION = (
    "Run a bash command; stdout and stderr come back combined. Only the last 50KB of "
    "output is shown, and the full output is saved as an artifact when it is cut. Prefer "
    "the read, grep, find, edit and write tools to cat, grep, find, sed -i and echo "
    "redirects."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "Shell command to execute"},
        "timeout": {"type": "number", "description": "Timeout in seconds"},
        "cwd": {"type": "string", "description": "Working directory"},
        "head": {
            "type": "integer",
            "minimum": 0,
            "description": "Return only the first N lines of output",
        },
        "tail": {
            "type": "integer",
            "minimum": 0,
            "description": "Return only the last N lines of output",
        },
    },
    "required": ["command"],
}
#: Timeout when the model gives none (pi's own default).
DEFAULT_TIMEOUT_S = 300.0
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 3600.0
MAX_BYTES = 50 * 1024
#: Most artifacts a session lists (`resources/list`); older ones stay readable on their
#: host by id until `bashfleet gc` removes them, but are no longer listed.
MAX_ARTIFACTS = 100


def format_size(size: int) -> str:
    """A size as pi's notices show it: `812B`, `50.0KB`, `1.2MB`."""
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}KB"
    return f"{size / (1024 * 1024):.1f}MB"


def clamp_timeout(timeout: float | None) -> float:
    """The timeout, clamped to [1, 3600] seconds as pi clamps it."""
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    return max(MIN_TIMEOUT_S, min(MAX_TIMEOUT_S, timeout))


def resolve_cwd(cwd: str | None, session_cwd: str | None) -> str | None:
    """`cwd` resolved against the session's directory, as pi's `resolveToCwd` does.

    Absolute and `~` paths stand alone (the worker expands `~`); an empty `cwd` means
    the session's directory.
    """
    if not cwd:
        return session_cwd
    if cwd.startswith(("/", "~")) or not session_cwd:
        return cwd
    return posixpath.normpath(posixpath.join(session_cwd, cwd))


def remember_artifact(session: SessionState, result: CallResult, command: str, at: float) -> None:
    """List a call's kept full output in the session (what `artifact://<id>` names)."""
    spill = result.spill
    if spill is None or spill.stdout_path is None:
        return
    session.artifacts[result.call_id] = Artifact(
        call_id=result.call_id, host=spill.host, path=spill.stdout_path,
        size=spill.stdout_bytes, command=command, at=at,
    )
    while len(session.artifacts) > MAX_ARTIFACTS:
        del session.artifacts[next(iter(session.artifacts))]


def annotated(notice: str, output: str) -> str:
    """Output under an executor annotation, as pi's `OutputSink.dump(notice)` shapes it:
    `[notice]` on the first line, then the output."""
    return f"[{notice}]\n{output}"


def truncation_notice(info: TruncationInfo | None, artifact_id: str | None) -> str:
    """Pi's meta notice: `\\n\\n[Showing lines A-B of T (50.0KB limit). Full: artifact://ID]`."""
    if info is None or not info.truncated:
        return ""
    if info.limit != "bytes" and info.total_bytes <= MAX_BYTES:
        return ""  # `head`/`tail` of an output the sink kept whole: nothing to add
    if info.shown_ranges:
        start, end = info.shown_ranges[0]
        notice = f"Showing lines {start}-{end} of {info.total_lines}"
    else:
        notice = f"Showing {info.shown_lines} of {info.total_lines} lines"
    if info.limit == "bytes":
        notice += f" ({format_size(MAX_BYTES)} limit)"
    if artifact_id:
        notice += f". Full: artifact://{artifact_id}"
    return f"\n\n[{notice}]"


class PiDialect(Dialect):
    """Pi's bash tool: head/tail line limits, a 50 KB tail, interception rules."""

    name = "pi"

    def __init__(
        self, intercept: Sequence[InterceptRule] = (), available_tools: Sequence[str] = ()
    ) -> None:
        self._intercept = tuple(intercept)
        self._available_tools = tuple(available_tools)

    def policy(self) -> Policy:
        """Combined output, 50 KB UTF-8-safe tail, head/tail lifting, kill on timeout."""
        return Policy(
            name=self.name,
            streams="combined",
            truncation=ByteTail(max_bytes=MAX_BYTES),
            default_timeout_s=DEFAULT_TIMEOUT_S,
            max_timeout_s=MAX_TIMEOUT_S,
            on_timeout="kill",
            lift_head_tail=True,
            # Pi keeps an artifact only for an output past its in-memory 50 KB.
            spill_min_bytes=MAX_BYTES,
            intercept=self._intercept,
            available_tools=self._available_tools,
        )

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """The one `bash` tool."""
        return [ToolSpec("bash", DESCRIPTION, SCHEMA)]

    def handlers(self) -> Mapping[str, Handler]:
        """`bash` only."""
        return {"bash": self._bash}

    def invalid(self, tool: str, message: str) -> ToolText:
        """Pi's validation error shape."""
        return ToolText(f'Validation failed for tool "{tool}":\n  - {message}', is_error=True)

    def system_error(self, message: str) -> ToolText:
        """Pi throws a `ToolError` with the bare message."""
        return ToolText(message, is_error=True)

    def _bash(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        command = args.text("command") or ""
        problem = command_problem(command) or path_problem("cwd", args.text("cwd") or "")
        if problem:
            raise ArgError(problem)
        head, tail = args.integer("head"), args.integer("tail")
        timeout = clamp_timeout(args.number("timeout"))
        sent_at = time.time()
        result = runner.execute(RunRequest(
            command=command,
            host=session.host,
            timeout=timeout,
            cwd=resolve_cwd(args.text("cwd"), session.cwd),
            policy=self.policy(),
            env=dict(session.env),
            head=head,
            tail=tail,
        ))
        remember_artifact(session, result, command, sent_at)
        return self.render(result, timeout)

    def render(self, result: CallResult, timeout: float) -> ToolText:
        """Pi's result shaping and error mapping."""
        ran = result.exit_code is not None or result.signal is not None or result.timed_out
        if result.error is not None and not ran:
            # bad_cwd and blocked messages are already pi's own text.
            return self.system_error(result.error.message)
        artifact = result.call_id if result.spill is not None else None
        notice = truncation_notice(result.stdout_truncation, artifact)
        if result.cancelled:
            return ToolText(annotated("Command cancelled", result.stdout) + notice, is_error=True)
        if result.timed_out:
            timed_out = f"Command timed out after {timeout:g} seconds"
            return ToolText(annotated(timed_out, result.stdout) + notice, is_error=True)
        text = (result.stdout or "(no output)") + notice
        if result.exit_code is None:
            return ToolText(f"{text}\n\nCommand failed: missing exit status", is_error=True)
        if result.exit_code != 0:
            return ToolText(f"{text}\n\nCommand exited with code {result.exit_code}", is_error=True)
        return ToolText(text)
