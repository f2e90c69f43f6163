"""The `modes` dialect: `bash` {command, mode}, combined output.

`mode` picks the timeout: `default` 30 s, `slow` 15 minutes, `background` a detached
job (24 hours). A timed-out command's process group is killed (SIGTERM, 15 s grace,
SIGKILL) and its partial output returned after a `[command timed out after ...]` line.
Output past 128 KB keeps its first and last 4 KB around `[snip]`.

Texts beyond the original tool's examples, in its style:
- a middle-truncated output ends with `[full output: <path> on host <h> (N bytes,
  M lines)]`, so the model knows where the rest is;
- a command ended by a signal: `[command failed: exit code -1 (killed by SIGNAME)]`
  (-1 is what the original tool's `status.code().unwrap_or(-1)` shows; the signal is added);
- system errors (bad cwd, spawn failure, fleet unavailable): `[system error: ...]`,
  never mistaken for a command failure;
- after a timed-out command's partial output, `[processes at the timeout, now killed:
  ...]` lists what it was running (pid, state, CPU seconds, command) and how long ago
  it last printed.

A background job's output file lives on the host that runs it, so starting a job pins
the session to that host. Its reminder, `To stop: kill -9 -<pgid>`, is the original
tool's; but each call runs in a sandbox of its own (a PID namespace), where a later call
cannot see the job: a command that is exactly such a `kill` of one of the session's jobs
is therefore sent to the job's host as a kill of that job, and answered as bash would
(nothing; or `No such process` when the job had already ended).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from bashfleet.client.dialects._text import activity, seconds, signal_label, system_failure
from bashfleet.client.dialects.args import ArgError, Args, command_problem
from bashfleet.client.dialects.base import (
    Dialect,
    GuardedRunner,
    Handler,
    SessionState,
    ToolSpec,
    ToolText,
)
from bashfleet.worker.wire.control import NO_LINE, CheckRequest, KillRequest
from bashfleet.worker.wire.models import CallResult, JobHandle, Middle, Policy, RunRequest

#: `kill`, `kill -9`, `kill -KILL`... of a process group (`-N`) or a pid.
_KILL = re.compile(
    r"^\s*kill\s+(?:-(?P<signal>9|KILL|SIGKILL|15|TERM|SIGTERM)\s+)?(-?)(\d+)\s*;?\s*$"
)

DESCRIPTION_TEMPLATE = """\
Executes shell commands via bash -c, returning combined stdout/stderr.
Bash state changes (working dir, variables, aliases) don't persist between calls.

With mode="background", returns immediately with output redirected to a file.
Use background for servers/demos that need to stay running.

Use mode="slow" for potentially slow commands: builds, downloads,
installs, tests, or any other substantive operation.

IMPORTANT: Keep commands concise. The command input must be less than 60k tokens.
For complex scripts, write them to a file first and then execute the file.

<pwd>{working_directory}</pwd>"""

SCHEMA = {
    "type": "object",
    "required": ["command"],
    "properties": {
        "command": {"type": "string", "description": "Shell command to execute via bash -c"},
        "mode": {
            "type": "string",
            "enum": ["default", "slow", "background"],
            "description": (
                "Execution mode: default (30s timeout), slow (15min timeout), background (detached)"
            ),
        },
    },
}

DEFAULT_TIMEOUT_S = 30.0
SLOW_TIMEOUT_S = 15 * 60.0
BACKGROUND_TIMEOUT_S = 24 * 60 * 60.0
#: The process group gets 15 seconds between SIGTERM and SIGKILL.
KILL_GRACE_S = 15.0
MAX_OUTPUT_LENGTH = 128 * 1024
SNIP_SIZE = 4 * 1024
#: Shown in the description when the session has no working directory: the worker's home.
HOME_PWD = "~"  # noqa: S105 - a directory, not a password

_KIB = 1024
_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024


def humanize_bytes(size: int) -> str:
    """A size as the truncation header shows it: `812B`, `128kB`, `3MB`.

    The format of Sketch's bash tool, which the header comes from: below 4 KiB
    the exact byte count; below 1 MiB whole kibibytes written `kB`; below 1 GiB whole
    mebibytes written `MB`; beyond, `more than 1GB`. Values are rounded half up, so
    131072 bytes is `128kB` and 1.5 MiB is `2MB`.
    """
    if size < 4 * _KIB:
        return f"{size}B"
    if size < _MIB:
        return f"{(size + _KIB // 2) // _KIB}kB"
    if size < _GIB:
        return f"{(size + _MIB // 2) // _MIB}MB"
    return "more than 1GB"


def _activity_notice(result: CallResult) -> str:
    """After the timed-out output: what the call was running when killed, its last output."""
    found = activity(result)
    if found is None:
        return ""
    processes, age = found
    lines = ["processes at the timeout, now killed:", *(f"  {p}" for p in processes)]
    return "[" + "\n".join([*lines, age] if processes else [age]) + "]"


def _after(text: str, block: str) -> str:
    """`block` on a line of its own after `text` (which may or may not end a line)."""
    if not block:
        return text
    return text + ("" if not text or text.endswith("\n") else "\n") + block


class ModesDialect(Dialect):
    """The modes bash tool: `default` (30 s), `slow` (15 minutes) and `background`.

    The constructor's options are the tool's own values by default; tests shorten them to
    watch a timeout or a background job's end without waiting 30 seconds or a day.
    """

    name = "modes"

    def __init__(
        self,
        *,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        background_timeout_s: float = BACKGROUND_TIMEOUT_S,
        kill_grace_s: float = KILL_GRACE_S,
    ) -> None:
        self._default_timeout_s = default_timeout_s
        self._background_timeout_s = background_timeout_s
        self._kill_grace_s = kill_grace_s

    def policy(self) -> Policy:
        """Combined output, middle cut past 128 KB, 30 s then kill with 15 s grace.

        A background job is ended after 24 hours (as the original `execute_background`).
        """
        return Policy(
            name=self.name,
            streams="combined",
            truncation=Middle(max_bytes=MAX_OUTPUT_LENGTH, keep_bytes=SNIP_SIZE),
            default_timeout_s=self._default_timeout_s,
            background_timeout_s=self._background_timeout_s,
            on_timeout="kill",
            kill_grace_s=self._kill_grace_s,
        )

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """The `bash` tool; its description shows the working directory."""
        description = DESCRIPTION_TEMPLATE.replace("{working_directory}", cwd or HOME_PWD)
        return [ToolSpec("bash", description, SCHEMA)]

    def handlers(self) -> Mapping[str, Handler]:
        """`bash` only."""
        return {"bash": self._bash}

    def invalid(self, tool: str, message: str) -> ToolText:
        """Bad arguments: a system error in the tool's bracket style, not a command failure."""
        return ToolText(f"[invalid input: {message}]", is_error=True)

    def _bash(self, args: Args, runner: GuardedRunner, session: SessionState) -> ToolText:
        command = args.text("command") or ""
        problem = command_problem(command)
        if problem:
            raise ArgError(problem)
        mode = args.text("mode") or "default"
        killed = self._kill_job(command, runner, session)
        if killed is not None:
            return killed
        result = runner.execute(RunRequest(
            command=command,
            host=session.host,
            mode=mode,
            cwd=session.cwd,
            policy=self.policy(),
            env=dict(session.env),
        ))
        return self.render(result, mode, command, session)

    def _kill_job(
        self, command: str, runner: GuardedRunner, session: SessionState
    ) -> ToolText | None:
        """The answer to `kill [-9] -<pgid>` of one of the session's jobs, done through
        the fleet; None for any other command (it runs as it is)."""
        match = _KILL.match(command)
        number = int(match.group(3)) if match else None
        job = next((j for j in session.jobs.values() if number in (j.pgid, j.pid)), None)
        if match is None or job is None:
            return None
        if not runner.check_job(CheckRequest(id=job.id, grep=NO_LINE)).running:
            gone = f"bash: line 1: kill: ({match.group(2)}{number}) - No such process"
            return ToolText(f"[command failed: exit code 1]\n{gone}", is_error=True)
        signal = 15 if match["signal"] in (None, "15", "TERM", "SIGTERM") else 9
        runner.kill_job(KillRequest(id=job.id, signal=signal))
        return ToolText("")

    def render(
        self, result: CallResult, mode: str, command: str, session: SessionState
    ) -> ToolText:
        """The text of one call: `format_output`'s shape, and the timeout and failure lines."""
        failure = system_failure(result)
        if failure is not None:
            return self.system_error(failure.message)
        if result.job is not None and not result.timed_out:
            return self._started(result.job, command, session)
        text, failed = self._output(result), False
        if result.timed_out:
            timeout = SLOW_TIMEOUT_S if mode == "slow" else self.policy().default_timeout_s
            text, failed = f"[command timed out after {seconds(timeout)}]\n{text}", True
        elif result.exit_code != 0:
            code = result.exit_code if result.exit_code is not None else -1
            why = f" (killed by {signal_label(result.signal)})" if result.signal is not None else ""
            text, failed = f"[command failed: exit code {code}{why}]\n{text}", True
        if result.error is not None:
            text += f"\n[warning: {result.error.message}]"
        if result.timed_out:
            text = _after(text, _activity_notice(result))
        return ToolText(text, is_error=failed)

    def _output(self, result: CallResult) -> str:
        """The combined output, with the truncation header when its middle was cut."""
        info = result.stdout_truncation
        if info is None or not info.truncated:
            return result.stdout
        header = (
            f"[output truncated in middle: got {humanize_bytes(info.total_bytes)}, "
            f"max is {humanize_bytes(MAX_OUTPUT_LENGTH)}]"
        )
        spill = result.spill
        counts = f"{info.total_bytes} bytes, {info.total_lines} lines"
        if spill is None or spill.stdout_path is None:
            trailer = f"[full output ({counts}) was not kept]"
        elif spill.error:
            trailer = (
                f"[full output may be incomplete: {spill.stdout_path} on host {spill.host} "
                f"({spill.error})]"
            )
        else:
            trailer = f"[full output: {spill.stdout_path} on host {spill.host} ({counts})]"
        return f"{header}\n{result.stdout}\n\n{trailer}"

    def _started(self, job: JobHandle, command: str, session: SessionState) -> ToolText:
        session.remember(job, command)
        # The output file and the kill target are on the job's host: pin the session there.
        if session.host is None:
            session.host = job.host
        # The original tool prints its child's pid, which leads its own group: pid and pgid
        # are the same number there. We print the pgid in both places.
        return ToolText(
            f"<pid>{job.pgid}</pid>\n<output_file>{job.output_path}</output_file>\n"
            f"<reminder>To stop: kill -9 -{job.pgid}</reminder>"
        )
