"""The `claude` dialect: `Bash`, `BashOutput` and `KillBash`, modelled on Claude Code.

`Bash` runs a command in the foreground (timeout in milliseconds: 120000 by default,
600000 at most, larger ones refused) or, with `run_in_background`, as a job whose id
(`bash_id`) the two other tools take. Output is combined and capped at 30,000
characters. Ids are the fleet's job ids; a session only reaches the jobs it started,
so an unknown or expired id gets Claude Code's `No shell found with ID: <id>`.

Result texts, after Claude Code's own:
- `Bash`: the output (leading blank lines and trailing whitespace trimmed); when cut,
  `\\n\\n... [N lines truncated] ...` (N: lines not shown, a cut line counted once)
  and where the full output is; an empty success is
  `<system>Tool ran without output or errors</system>`; a failure starts with
  `Exit code N` (128+N for a signal), a timeout with `Command timed out after 2m 0.0s`;
  in background: `Command running in background with ID: <id>`;
- `BashOutput`: `<status>running|completed|killed|failed</status>`, `<exit_code>` once
  ended, `<stdout>` / `<stderr>` blocks with the output new since the last read;
- `KillBash`: `Successfully killed shell: <id> (<command>)`, or
  `Shell <id> is not running, so cannot be killed (status: <status>)`.

Claude Code's names of today are answered too (not listed: the model is shown the three
tools above): `TaskOutput` {task_id, block (default true), timeout (ms to wait while
blocking: 30000 by default, 600000 at most)} reads the same output as `BashOutput`,
having waited for the task to end when `block` is true, as
`<retrieval_status>success|timeout|not_ready</retrieval_status>`, `<task_id>`,
`<task_type>local_bash</task_type>`, `<status>`, `<exit_code>` once ended and `<output>`;
`TaskStop` {task_id, or the deprecated shell_id} stops it as `KillBash` does:
`Successfully stopped task: <id> (<command>)`, or
`Task <id> is not running (status: <status>)`. An unknown id is
`No task found with ID: <id>`.

Session persistence: every call runs in the session's shell
(`SessionState.fleet_session`, named on first use: `bashfleet.client.shells`), which the fleet
keeps in Redis: a foreground `Bash` reports the state its command ended with, and the
variables it exported or changed, those it unset (also those of the worker's own
environment, such as `LANG`) and the directory it `cd`-ed into hold for the session's
next calls, as in one long-lived shell, also when several calls run at once or another
process (`bashfleet run --session ID`) shares the session. The shell starts in the
session's `cwd`. Background commands are not captured: they end after later calls have
already run.

A timed-out command's text ends with what it was running when it was killed (pid,
state, CPU seconds, command) and how long ago it last printed.
"""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections.abc import Mapping
from typing import Any

from bashfleet.client.dialects._text import (
    activity,
    chomp,
    sentence,
    shell_status,
    system_failure,
    without_completion_line,
)
from bashfleet.client.dialects.args import ArgError, Args, command_problem
from bashfleet.client.dialects.base import (
    Dialect,
    GuardedRunner,
    Handler,
    RefusalError,
    SessionJob,
    SessionState,
    ToolSpec,
    ToolText,
)
from bashfleet.worker.wire.control import CheckRequest, KillRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CharCap,
    CheckResult,
    Policy,
    RunRequest,
    TruncationInfo,
)

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000
#: TaskOutput's wait while blocking: its default, and at most (Claude Code's).
DEFAULT_WAIT_MS = 30_000
MAX_WAIT_MS = 600_000
#: Seconds between two looks at a task TaskOutput waits for: the first, and at most.
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 1.0
MAX_OUTPUT_CHARS = 30_000
EMPTY_OUTPUT = "<system>Tool ran without output or errors</system>"
#: Signals that mean "stopped by someone", reported as status `killed`.
_KILL_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP})

BASH_DESCRIPTION = """\
Executes a bash command and returns its combined stdout and stderr.

- timeout is in milliseconds: 120000 (2 minutes) unless given, at most 600000 (10 minutes). \
A command still running at its timeout is killed.
- Output longer than 30000 characters is truncated; the full output is kept on the host \
that ran the command.
- Set run_in_background to true for servers, watchers and long builds: the call returns at \
once with a shell ID. Read its output with BashOutput and stop it with KillBash.
- Quote paths that contain spaces. Prefer dedicated tools (Read, Grep, Glob, Edit) to cat, \
grep, find and sed."""

BASH_OUTPUT_DESCRIPTION = """\
Retrieves output from a running or completed background bash shell.

- Takes the bash_id that Bash returned for a command run in the background.
- Returns only the output printed since the last BashOutput call for that shell, with the \
shell's status (and exit code once it has ended).
- filter is an optional regular expression: only matching lines are returned."""

KILL_BASH_DESCRIPTION = """\
Kills a running background bash shell by its ID, with every process it started.

- Takes the bash_id that Bash returned for a command run in the background."""

BASH_SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The command to execute"},
        "timeout": {
            "type": "number",
            "description": "Optional timeout in milliseconds (max 600000)",
        },
        "description": {
            "type": "string",
            "description": "Clear, concise description of what this command does in 5-10 words",
        },
        "run_in_background": {
            "type": "boolean",
            "description": (
                "Set to true to run this command in the background. "
                "Use BashOutput to read the output later."
            ),
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}
BASH_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "bash_id": {
            "type": "string",
            "description": "The ID of the background shell to retrieve output from",
        },
        "filter": {
            "type": "string",
            "description": (
                "Optional regular expression to filter the output lines. Only lines matching "
                "this regex will be included in the result. Any lines that do not match will "
                "no longer be available to read."
            ),
        },
    },
    "required": ["bash_id"],
    "additionalProperties": False,
}
KILL_BASH_SCHEMA = {
    "type": "object",
    "properties": {
        "bash_id": {"type": "string", "description": "The ID of the background shell to kill"},
    },
    "required": ["bash_id"],
    "additionalProperties": False,
}

TASK_OUTPUT_DESCRIPTION = """\
- Retrieves output from a running or completed task (background shell)
- Takes a task_id parameter identifying the task
- Returns the task output along with status information
- Use block=true (default) to wait for task completion
- Use block=false for non-blocking check of current status"""

TASK_STOP_DESCRIPTION = """\
- Stops a running background task by its ID
- Takes a task_id parameter identifying the task to stop"""

TASK_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "description": "The task ID to get output from"},
        "block": {"type": "boolean", "description": "Whether to wait for completion"},
        "timeout": {"type": "number", "description": "Max wait time in ms"},
    },
    "required": ["task_id"],
    "additionalProperties": False,
}
TASK_STOP_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "description": "The ID of the background task to stop"},
        "shell_id": {"type": "string", "description": "Deprecated: use task_id instead"},
    },
    "additionalProperties": False,
}


def format_duration(ms: float) -> str:
    """Claude Code's durations: `45.0s` below a minute, else `2m 0.0s`."""
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    minutes, rest = divmod(ms, 60_000)
    return f"{int(minutes)}m {rest / 1000:.1f}s"


def _number(value: float) -> str:
    """`3600000`, not `3.6e+06`: numbers as the model wrote them."""
    return str(int(value)) if value.is_integer() else repr(value)


def lines_cut(info: TruncationInfo) -> int:
    """Lines not shown (whole or in part) of a cut output."""
    return info.total_lines - info.shown_lines + (1 if info.partial_line else 0)


def _tidy(text: str) -> str:
    """Claude Code's trim: leading blank lines and trailing whitespace go."""
    return re.sub(r"^(\s*\n)+", "", text).rstrip()


def _activity_notice(result: CallResult) -> str:
    """What a timed-out command was running when killed, and when it last printed."""
    found = activity(result)
    if found is None:
        return ""
    processes, age = found
    lines = ["Processes at the timeout, now killed:", *(f"  {p}" for p in processes)]
    return "\n".join([*lines, sentence(age)] if processes else [sentence(age)])


def _status(result: CheckResult, job: SessionJob) -> str:
    """BashOutput's status word."""
    if result.running:
        return "running"
    if job.killed or (result.signal is not None and result.signal in _KILL_SIGNALS):
        return "killed"
    return "completed" if result.exit_code == 0 else "failed"


class ClaudeDialect(Dialect):
    """Claude Code's Bash, BashOutput and KillBash (its older tool names)."""

    name = "claude"

    def policy(self) -> Policy:
        """Combined output, 30,000 characters, 120 s default, 600 s max, kill on timeout."""
        return Policy(
            name=self.name,
            streams="combined",
            truncation=CharCap(max_chars=MAX_OUTPUT_CHARS),
            default_timeout_s=DEFAULT_TIMEOUT_MS / 1000,
            max_timeout_s=MAX_TIMEOUT_MS / 1000,
            on_timeout="kill",
        )

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """Bash, BashOutput, KillBash."""
        return [
            ToolSpec("Bash", BASH_DESCRIPTION, BASH_SCHEMA),
            ToolSpec("BashOutput", BASH_OUTPUT_DESCRIPTION, BASH_OUTPUT_SCHEMA),
            ToolSpec("KillBash", KILL_BASH_DESCRIPTION, KILL_BASH_SCHEMA),
        ]

    def aliases(self) -> list[ToolSpec]:
        """Claude Code's names of today for BashOutput and KillBash."""
        return [
            ToolSpec("TaskOutput", TASK_OUTPUT_DESCRIPTION, TASK_OUTPUT_SCHEMA),
            ToolSpec("TaskStop", TASK_STOP_DESCRIPTION, TASK_STOP_SCHEMA),
        ]

    def handlers(self) -> Mapping[str, Handler]:
        """One handler per tool (and per name Claude Code uses today)."""
        return {"Bash": self._bash, "BashOutput": self._output, "KillBash": self._kill,
                "TaskOutput": self._task_output, "TaskStop": self._task_stop}

    def invalid(self, tool: str, message: str) -> ToolText:
        """Claude Code's input validation error."""
        return ToolText(
            f"InputValidationError: {tool} failed due to the following issue:\n{message}",
            is_error=True,
        )

    def unknown_tool(self, tool: str) -> ToolText:
        """Claude Code's answer to a tool it does not have."""
        return ToolText(f"Error: No such tool available: {tool}", is_error=True)

    def system_error(self, message: str) -> ToolText:
        """A failure of the tool itself, as an error result."""
        return ToolText(f"Error: {message}", is_error=True)

    # ---------------------------------------------------------------------------- Bash

    def _bash(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        command = args.text("command") or ""
        problem = command_problem(command)
        if problem:
            raise ArgError(problem)
        timeout_ms = args.number("timeout")
        if timeout_ms is not None and timeout_ms <= 0:
            raise ArgError(
                f"timeout must be a positive number of milliseconds, not {_number(timeout_ms)}"
            )
        if timeout_ms is not None and timeout_ms > MAX_TIMEOUT_MS:
            raise ArgError(
                f"timeout {_number(timeout_ms)} ms is above the maximum of {MAX_TIMEOUT_MS} ms "
                "(10 minutes); use run_in_background for longer commands"
            )
        if args.flag("run_in_background"):
            result = runner.execute(self._request(command, session, mode="background"))
            return self.render_started(result, command, session)
        timeout_ms = timeout_ms if timeout_ms is not None else DEFAULT_TIMEOUT_MS
        result = runner.execute(self._request(command, session, timeout=timeout_ms / 1000))
        return self.render(result, timeout_ms)

    def _request(self, command: str, session: SessionState, **options: Any) -> RunRequest:
        """A run in the session's shell (its variables and cwd kept), which starts in the
        session's cwd."""
        if session.fleet_session is None:
            session.fleet_session = f"claude-{uuid.uuid4().hex[:24]}"
        return RunRequest(
            command=command, host=session.host, session=session.fleet_session,
            default_cwd=session.cwd, policy=self.policy(), **options,
        )

    def render_started(self, result: CallResult, command: str, session: SessionState) -> ToolText:
        """A background start: the shell id, remembered in the session."""
        failure = system_failure(result)
        if failure is not None or result.job is None:
            return self.system_error(failure.message if failure else "the job did not start")
        session.remember(result.job, command)
        return ToolText(f"Command running in background with ID: {result.job.id}")

    def render(self, result: CallResult, timeout_ms: float) -> ToolText:
        """A foreground command's text."""
        failure = system_failure(result)
        if failure is not None:
            return self.system_error(failure.message)
        output = _tidy(result.stdout)
        info = result.stdout_truncation
        if info is not None and info.truncated:
            output += f"\n\n... [{lines_cut(info)} lines truncated] ...{self._where(result)}"
        if result.error is not None:
            output += f"\n{result.error.message}"
        head = None
        if result.timed_out:
            head = f"Command timed out after {format_duration(timeout_ms)}"
            output = "\n".join(filter(None, [output, _activity_notice(result)]))
        elif result.exit_code != 0:
            head = f"Exit code {shell_status(result.exit_code, result.signal)}"
        if head is None:
            return ToolText(output or EMPTY_OUTPUT)
        return ToolText(f"{head}\n{output}" if output else head, is_error=True)

    def _where(self, result: CallResult) -> str:
        spill = result.spill
        if spill is None or spill.stdout_path is None:
            return ""
        return f"\n\nFull output: {spill.stdout_path} on host {spill.host}"

    # ---------------------------------------------------------------- BashOutput / Kill

    def _job(self, args: Args, session: SessionState) -> SessionJob:
        # Claude Code's answer to an id that never existed or has expired.
        return _session_job(session, args.text("bash_id") or "", "No shell found with ID")

    def _output(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        job = self._job(args, session)
        pattern = args.text("filter") or None
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ArgError(f"filter is not a valid regular expression: {exc}") from None
        return self.render_output(_read_new(runner, session, job, pattern), job)

    def render_output(self, result: CheckResult, job: SessionJob) -> ToolText:
        """BashOutput's text: status, exit code once ended, new stdout and stderr."""
        result = without_completion_line(result)
        status = _status(result, job)
        blocks = [f"<status>{status}</status>"]
        code = shell_status(result.exit_code, result.signal)
        if status in ("completed", "failed") and code is not None:
            blocks.append(f"<exit_code>{code}</exit_code>")
        if result.output:
            info = result.output_truncation
            cut = ""
            if info is not None and info.truncated:
                cut = f"... [{lines_cut(info)} lines truncated] ...\n"
            blocks.append(f"<stdout>\n{cut}{chomp(result.output)}\n</stdout>")
            if cut:
                blocks.append(f"Full output: {result.output_path} on host {result.host}")
        if result.stderr_output:
            blocks.append(f"<stderr>\n{chomp(result.stderr_output)}\n</stderr>")
        if result.note:
            blocks.append(f"<note>{result.note}</note>")
        return ToolText("\n\n".join(blocks))

    def _kill(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        job = self._job(args, session)
        status = _stop_if_running(runner, session, job)
        if isinstance(status, CheckResult):
            return self.render_kill(status, job)
        return ToolText(
            f"Shell {job.id} is not running, so cannot be killed (status: {status})",
            is_error=True,
        )

    def render_kill(self, result: CheckResult, job: SessionJob) -> ToolText:
        """KillBash's text once the kill was sent."""
        if result.running:
            why = f": {result.note}" if result.note else ""
            return ToolText(f"Failed to kill shell: {job.id} ({job.command}){why}", is_error=True)
        job.killed = True
        return ToolText(f"Successfully killed shell: {job.id} ({job.command})")

    # ------------------------------------------------------- TaskOutput / TaskStop

    def _task_output(self, args: Args, runner: GuardedRunner, session: SessionState
                     ) -> ToolText:
        job = _session_job(session, args.text("task_id") or "", "No task found with ID")
        wait_ms = args.number("timeout")
        if wait_ms is not None and not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ArgError(f"timeout must be between 0 and {MAX_WAIT_MS} ms, not "
                           f"{_number(wait_ms)}")
        block = args.flag("block") is not False
        if block:
            _wait_until_ended(runner, session, job, (wait_ms if wait_ms is not None
                                                     else DEFAULT_WAIT_MS) / 1000)
        return self.render_task_output(_read_new(runner, session, job, None), job, block)

    def render_task_output(self, result: CheckResult, job: SessionJob, blocked: bool
                           ) -> ToolText:
        """TaskOutput's text: how the retrieval went, the task's status, exit code once
        ended, and its output new since the last read."""
        result = without_completion_line(result)
        status = _status(result, job)
        retrieval = "success" if not result.running else "timeout" if blocked else "not_ready"
        blocks = [f"<retrieval_status>{retrieval}</retrieval_status>",
                  f"<task_id>{job.id}</task_id>", "<task_type>local_bash</task_type>",
                  f"<status>{status}</status>"]
        code = shell_status(result.exit_code, result.signal)
        if status in ("completed", "failed") and code is not None:
            blocks.append(f"<exit_code>{code}</exit_code>")
        output = "".join(filter(None, [result.output, result.stderr_output]))
        if output:
            info = result.output_truncation
            cut = ""
            if info is not None and info.truncated:
                cut = f"... [{lines_cut(info)} lines truncated] ...\n"
            blocks.append(f"<output>\n{cut}{chomp(output)}\n</output>")
        if result.note:
            blocks.append(f"<note>{result.note}</note>")
        return ToolText("\n\n".join(blocks))

    def _task_stop(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        task_id = args.text("task_id") or args.text("shell_id")
        if not task_id:
            raise ArgError("missing required parameter 'task_id'")
        job = _session_job(session, task_id, "No task found with ID")
        status = _stop_if_running(runner, session, job)
        if not isinstance(status, CheckResult):
            return ToolText(f"Task {job.id} is not running (status: {status})", is_error=True)
        killed = self.render_kill(status, job)
        if killed.is_error:
            return killed
        return ToolText(f"Successfully stopped task: {job.id} ({job.command})")


def _session_job(session: SessionState, job_id: str, unknown: str) -> SessionJob:
    """A job this session started, else the refusal `<unknown>: <id>`."""
    job = session.jobs.get(job_id)
    if job is None:
        raise RefusalError(ToolText(f"{unknown}: {job_id}", is_error=True))
    return job


def _read_new(runner: GuardedRunner, session: SessionState, job: SessionJob,
              pattern: str | None) -> CheckResult:
    """The job's state and its output since this session's last read (which moves on)."""
    offset = session.offsets.get(job.id, 0)
    result = runner.check_job(CheckRequest(id=job.id, grep=pattern, offset=offset))
    session.offsets[job.id] = result.offset
    return result


def _stop_if_running(runner: GuardedRunner, session: SessionState, job: SessionJob
                     ) -> CheckResult | str:
    """Kill the job if it still runs (its state after the kill), else its status word."""
    if job.killed:
        return "killed"
    # Learn whether it still runs without consuming output not read yet.
    before = runner.check_job(CheckRequest(id=job.id, offset=session.offsets.get(job.id, 0)))
    if before.running:
        return runner.kill_job(KillRequest(id=job.id))
    return _status(before, job)


def _wait_until_ended(runner: GuardedRunner, session: SessionState, job: SessionJob,
                      wait_s: float) -> None:
    """Return once the job ended, or after `wait_s` seconds. It looks at the job's record
    (`job_views`: Redis alone), else at its host with a check that reads no output past
    one character (the session's offset does not move)."""
    deadline = time.monotonic() + wait_s
    interval = _POLL_FIRST_S
    while not _ended(runner, session, job):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(interval, left))  # polling a condition, with a deadline
        interval = min(interval * 2, _POLL_MAX_S)


def _ended(runner: GuardedRunner, session: SessionState, job: SessionJob) -> bool:
    view = runner.job_views([job.id]).get(job.id)
    if view is not None and view.state != "unknown":
        return view.state == "ended"
    return not runner.check_job(CheckRequest(
        id=job.id, offset=session.offsets.get(job.id, 0),
        truncation=CharCap(max_chars=1))).running
