"""The `pipe` dialect: one `bash` tool, separate streams, auto-background.

One tool with three mutually exclusive parameters: `command` runs a command, `check_pid`
reports on a backgrounded one, `kill_pid` ends it. Output is tail-truncated per stream
(2000 lines or 50 KB); the full output is kept only when it is larger than 50 KB. A
command still running after its timeout (default 120 s) keeps running as a job.

The model addresses jobs by pid, as in the original tool; pids are not unique across
hosts and time, so the session maps each pid it was shown to the job id
(`SessionState.pids`). The partial output of the backgrounded notice counts as the first
look: `check_pid` shows what came after it ("new output since last check"), and
`kill_pid` what no look showed yet. The line the engine appends to a job's output when
it ends (the modes dialect's `[background process completed]`) is left out: the text
says how the process ended.

Texts beyond the original tool's examples, in its style:
- a stream truncated without a spill file (line limit only, 50 KB or less in all) says
  so and how to see the rest;
- auto-backgrounded calls keep stderr in its own file: when stderr is not empty a
  `Full stderr: <path>` line follows `Full output: <path>`;
- a command ended by a signal shows `exit code: 128+N (killed by SIGNAME)`, bash's `$?`;
- after the backgrounded text, a bracket lists the call's processes still running (pid,
  state, CPU seconds, command) and how long ago it last printed, so the model can tell
  a busy build from a command waiting on input.
"""

from __future__ import annotations

from collections.abc import Mapping

from bashfleet.client.dialects._text import (
    activity,
    chomp,
    count_lines,
    seconds,
    sentence,
    shell_status,
    signal_label,
    system_failure,
    without_completion_line,
)
from bashfleet.client.dialects.args import ArgError, Args, command_problem
from bashfleet.client.dialects.base import (
    Dialect,
    GuardedRunner,
    Handler,
    SessionState,
    ToolSpec,
    ToolText,
)
from bashfleet.worker.wire.control import CheckRequest, KillRequest
from bashfleet.worker.wire.models import (
    MAX_TIMEOUT_S,
    CallResult,
    CheckResult,
    JobHandle,
    Policy,
    RunRequest,
    TailLines,
    TruncationInfo,
)

DESCRIPTION = (
    "Execute a bash command. Output truncated to last 2000 lines or 50KB; if truncated, "
    "full output saved to temp file. Commands exceeding timeout are auto-backgrounded."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The bash command to execute"},
        "timeout": {
            "type": "integer",
            "description": "Timeout in ms before auto-backgrounding (default: 120000)",
        },
        "check_pid": {
            "type": "integer",
            "description": "Check on a backgrounded process, return new output",
        },
        "kill_pid": {
            "type": "integer",
            "description": "Kill a backgrounded process, return final output",
        },
    },
}
DEFAULT_TIMEOUT_MS = 120_000
_ACTIONS = ("command", "check_pid", "kill_pid")


def _label(stream: str, info: TruncationInfo | None) -> str:
    """`stdout`, or `stdout (last 2000 of 8500 lines)` when the stream was cut."""
    if info is None or not info.truncated:
        return stream
    return f"{stream} (last {info.shown_lines} of {info.total_lines} lines)"


def _what_is_shown(info: TruncationInfo) -> str:
    if info.partial_line and info.shown_lines <= 1:
        # One huge line: its tail is all that is shown, counted in bytes.
        return f"Showing last {info.shown_bytes} of {info.total_bytes} bytes"
    return f"Showing last {info.shown_lines} of {info.total_lines} lines"


def truncation_notice(
    stream: str, info: TruncationInfo | None, path: str | None, error: str | None
) -> str | None:
    """The notice, `[stdout: Showing last 2000 of 8500 lines. Full output: <path>]`."""
    if info is None or not info.truncated:
        return None
    what = _what_is_shown(info)
    if path and error:
        return f"[{stream}: {what}. Full output file may be incomplete: {path} ({error})]"
    if path:
        return f"[{stream}: {what}. Full output: {path}]"
    return (
        f"[{stream}: {what}. Full output not saved (50KB or less); "
        "rerun the command piped to head or sed to see the rest.]"
    )


def _full_output(path: str, stderr_path: str | None) -> str:
    text = f"Full output: {path}"
    return text + (f"\nFull stderr: {stderr_path}" if stderr_path else "")


def _exit_line(result: CallResult) -> str:
    status = shell_status(result.exit_code, result.signal)
    if status is None:
        return "exit code: unknown"
    line = f"exit code: {status}"
    if result.exit_code is None and result.signal is not None:
        reason = f"killed by {signal_label(result.signal)}"
        if result.timed_out:
            reason = "timed out, " + reason
        line += f" ({reason})"
    return line


def _activity_notice(result: CallResult) -> str:
    """After the backgrounded text: what still runs, and when it last printed."""
    found = activity(result)
    if found is None:
        return ""
    processes, age = found
    lines = ["Processes still running:", *(f"  {line}" for line in processes)] if processes else []
    return "\n\n[" + "\n".join([*lines, sentence(age)]) + "]"


class PipeDialect(Dialect):
    """The pipe bash tool: `command`, `timeout`, `check_pid`, `kill_pid`."""

    name = "pipe"

    def policy(self) -> Policy:
        """Separate streams, tail 2000 lines / 50 KB each, auto-background after 120 s."""
        return Policy(
            name=self.name,
            streams="separate",
            truncation=TailLines(max_lines=2000, max_bytes=51_200),
            default_timeout_s=DEFAULT_TIMEOUT_MS / 1000,
            on_timeout="background",
            # Spill only past 50 KB: line-only truncation keeps no file.
            spill_min_bytes=51_200,
            # The original tool kills the group with SIGKILL at once: no grace period.
            kill_grace_s=0.0,
        )

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """The one `bash` tool, its schema and description word for word."""
        return [ToolSpec("bash", DESCRIPTION, SCHEMA)]

    def handlers(self) -> Mapping[str, Handler]:
        """`bash` only."""
        return {"bash": self._bash}

    def _bash(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        chosen = [name for name in _ACTIONS if args.given(name)]
        if len(chosen) != 1:
            got = " and ".join(chosen) if chosen else "none of them"
            raise ArgError(f"give exactly one of command, check_pid or kill_pid (got {got})")
        if args.given("timeout") and chosen[0] != "command":
            raise ArgError("timeout applies only to command, not to check_pid or kill_pid")
        if chosen[0] == "command":
            return self._run(args, runner, session)
        pid = args.integer(chosen[0])
        if pid is None:  # unreachable: given, and validated as an integer
            raise ArgError(f"{chosen[0]} must be an integer")
        if chosen[0] == "check_pid":
            return self._check(pid, runner, session)
        return self._kill(pid, runner, session)

    # ------------------------------------------------------------------------- command

    def _run(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        command = args.text("command") or ""
        problem = command_problem(command)
        if problem:
            raise ArgError(problem)
        timeout_ms = args.integer("timeout")
        if timeout_ms is None:
            timeout_ms = DEFAULT_TIMEOUT_MS
        if not 0 < timeout_ms <= MAX_TIMEOUT_S * 1000:
            raise ArgError(
                f"timeout must be between 1 and {int(MAX_TIMEOUT_S * 1000)} ms, not {timeout_ms}"
            )
        result = runner.execute(RunRequest(
            command=command,
            host=session.host,
            timeout=timeout_ms / 1000,
            cwd=session.cwd,
            policy=self.policy(),
            env=dict(session.env),
        ))
        return self.render_run(result, command, timeout_ms / 1000, session)

    def render_run(
        self, result: CallResult, command: str, timeout_s: float, session: SessionState
    ) -> ToolText:
        """The text of a finished, failed or backgrounded command."""
        failure = system_failure(result)
        if failure is not None:
            return self.system_error(failure.message)
        if result.backgrounded and result.job is not None:
            return self._backgrounded(result, result.job, command, timeout_s, session)
        parts = [
            f"stdout:\n{chomp(result.stdout)}",
            f"stderr:\n{chomp(result.stderr)}",
            _exit_line(result),
        ]
        spill = result.spill
        for stream, info, path in (
            ("stdout", result.stdout_truncation, spill.stdout_path if spill else None),
            ("stderr", result.stderr_truncation, spill.stderr_path if spill else None),
        ):
            notice = truncation_notice(stream, info, path, spill.error if spill else None)
            if notice:
                parts.append(notice)
        if result.error is not None:
            parts.append(f"[warning: {result.error.message}]")
        failed = shell_status(result.exit_code, result.signal) != 0
        return ToolText("\n\n".join(parts), is_error=failed)

    def _backgrounded(
        self,
        result: CallResult,
        job: JobHandle,
        command: str,
        timeout_s: float,
        session: SessionState,
    ) -> ToolText:
        spill = result.spill
        stderr_path = spill.stderr_path if spill and spill.stderr_bytes else None
        session.remember(job, command, stderr_path=spill.stderr_path if spill else None)
        # The partial output below is the first look: check_pid shows what comes after.
        session.shown_until(job.id, result)
        out_path = spill.stdout_path if spill and spill.stdout_path else job.output_path
        text = (
            f"[Command backgrounded after {seconds(timeout_s)} timeout (pid {job.pid}). "
            "Partial output:\n\n"
            f"{_label('stdout', result.stdout_truncation)}:\n{chomp(result.stdout)}\n\n"
            f"{_label('stderr', result.stderr_truncation)}:\n{chomp(result.stderr)}\n\n"
            f"{_full_output(out_path, stderr_path)}\n"
            "Use check_pid or kill_pid to manage.]"
        )
        return ToolText(text + _activity_notice(result))

    # -------------------------------------------------------------------- check / kill

    def _job_id(self, pid: int, session: SessionState) -> str:
        job_id = session.pids.get(pid)
        if job_id is None:
            known = ", ".join(str(p) for p in sorted(session.pids)) or "none"
            raise ArgError(
                f"no backgrounded process with pid {pid} in this session (known pids: {known})"
            )
        return job_id

    def _stderr_path(self, job_id: str, session: SessionState, stderr: str) -> str | None:
        job = session.jobs.get(job_id)
        return job.stderr_path if job is not None and stderr else None

    def _check(self, pid: int, runner: GuardedRunner, session: SessionState) -> ToolText:
        job_id = self._job_id(pid, session)
        result = runner.check_job(CheckRequest(
            id=job_id,
            offset=session.offsets.get(job_id, 0),
            stderr_offset=session.stderr_offsets.get(job_id, 0),
        ))
        session.offsets[job_id] = result.offset
        session.stderr_offsets[job_id] = result.stderr_offset
        stderr_path = self._stderr_path(job_id, session, result.stderr_output)
        return self.render_check(pid, result, stderr_path)

    def render_check(self, pid: int, result: CheckResult, stderr_path: str | None) -> ToolText:
        """The check_pid text: still running with new output, or exited."""
        result = without_completion_line(result)
        if result.running:
            blocks = [f"Process {pid} still running.", self._new_output(result)]
            if result.stderr_output:
                blocks.append(f"stderr:\n{chomp(result.stderr_output)}")
        else:
            blocks = [f"Process {pid} {self._ending(result)}.", *self._final_streams(result)]
        return ToolText(self._bracket(blocks, result, stderr_path))

    def _new_output(self, result: CheckResult) -> str:
        if not result.output:
            return "No new output since last check."
        info = result.output_truncation
        total = info.total_lines if info is not None else count_lines(result.output)
        counted = f"{total} lines"
        if info is not None and info.truncated:
            counted += f", showing last {info.shown_lines}"
        return f"New output since last check ({counted}):\n{chomp(result.output)}"

    def _final_streams(self, result: CheckResult) -> list[str]:
        return [
            f"{_label('stdout', result.output_truncation)}:\n{chomp(result.output)}",
            f"stderr:\n{chomp(result.stderr_output)}",
        ]

    def _ending(self, result: CheckResult) -> str:
        if result.exit_code is not None:
            return f"exited with code {result.exit_code}"
        if result.signal is not None:
            return f"was killed by {signal_label(result.signal)}"
        return "ended (exit status unknown)"

    def _bracket(self, blocks: list[str], result: CheckResult, stderr_path: str | None) -> str:
        if result.note:
            blocks.append(f"Note: {result.note}")
        blocks.append(_full_output(result.output_path, stderr_path))
        return "[" + "\n\n".join(blocks) + "]"

    def _kill(self, pid: int, runner: GuardedRunner, session: SessionState) -> ToolText:
        job_id = self._job_id(pid, session)
        # Its final output: what no check showed yet.
        result = runner.kill_job(KillRequest(id=job_id, offset=session.offsets.get(job_id, 0)))
        session.offsets[job_id] = result.offset
        job = session.jobs.get(job_id)
        if job is not None and not result.running:
            job.killed = True
        stderr_path = self._stderr_path(job_id, session, result.stderr_output)
        return self.render_kill(pid, result, stderr_path)

    def render_kill(self, pid: int, result: CheckResult, stderr_path: str | None) -> ToolText:
        """kill_pid's text: the process's end and its final output."""
        result = without_completion_line(result)
        if result.running:
            head = f"Process {pid} is still running after the kill"
        elif result.exit_code is not None:
            # Neutral on purpose: it may have exited before the kill, or on its SIGTERM.
            head = f"Process {pid} ended with exit code {result.exit_code}"
        elif result.signal is not None:
            head = f"Process {pid} killed ({signal_label(result.signal)})"
        else:
            head = f"Process {pid} killed"
        blocks = [f"{head}.", *self._final_streams(result)]
        return ToolText(self._bracket(blocks, result, stderr_path), is_error=result.running)
