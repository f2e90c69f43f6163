"""The `claude-code` dialect: the bash tools Claude Code shows a model today, `Bash`,
`TaskOutput` and `TaskStop`.

The `claude` dialect lists `Bash`, `BashOutput` and `KillBash` and answers to the two
newer names without listing them, so a model shown its tools can never call them. This
one lists the newer set and answers to the older names without listing them: the
same policy (combined output, 30,000 characters, 120 s default, 600 s max, killed on
timeout), the same session shell and every result text of `claude`
(`bashfleet.client.dialects.claude`), with the background start pointing at the tools listed:

- `Bash` {command, timeout (ms), description, run_in_background}: as `claude`'s;
- `TaskOutput` {task_id, block (default true), timeout (ms to wait while blocking,
  30000 by default, 600000 at most)}: `<retrieval_status>`, `<task_id>`,
  `<task_type>local_bash</task_type>`, `<status>`, `<exit_code>` once ended, `<output>`;
- `TaskStop` {task_id}: `Successfully stopped task: <id> (<command>)`, or
  `Task <id> is not running (status: <status>)`; an unknown id is
  `No task found with ID: <id>`.
"""

from __future__ import annotations

from bashfleet.client.dialects.base import ToolSpec
from bashfleet.client.dialects.claude import (
    BASH_OUTPUT_DESCRIPTION,
    BASH_OUTPUT_SCHEMA,
    BASH_SCHEMA,
    KILL_BASH_DESCRIPTION,
    KILL_BASH_SCHEMA,
    TASK_OUTPUT_DESCRIPTION,
    TASK_OUTPUT_SCHEMA,
    ClaudeDialect,
)

BASH_DESCRIPTION = """\
Executes a bash command and returns its combined stdout and stderr.

- timeout is in milliseconds: 120000 (2 minutes) unless given, at most 600000 (10 minutes). \
A command still running at its timeout is killed.
- Output longer than 30000 characters is truncated; the full output is kept on the host \
that ran the command.
- Set run_in_background to true for servers, watchers and long builds: the call returns at \
once with a task ID. Read its output with TaskOutput and stop it with TaskStop.
- Quote paths that contain spaces. Prefer dedicated tools (Read, Grep, Glob, Edit) to cat, \
grep, find and sed."""

BASH_TOOL_SCHEMA = {
    **BASH_SCHEMA,
    "properties": {
        **BASH_SCHEMA["properties"],  # type: ignore[dict-item]
        "run_in_background": {
            "type": "boolean",
            "description": (
                "Set to true to run this command in the background. "
                "Use TaskOutput to read the output later."
            ),
        },
    },
}

TASK_STOP_DESCRIPTION = """\
- Stops a running background task by its ID
- Takes a task_id parameter identifying the task to stop
- Returns a success or failure status"""

TASK_STOP_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "description": "The ID of the background task to stop"},
    },
    "required": ["task_id"],
    "additionalProperties": False,
}


class ClaudeCodeDialect(ClaudeDialect):
    """Claude Code's Bash, TaskOutput and TaskStop (BashOutput and KillBash answered too)."""

    name = "claude-code"

    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """Bash, TaskOutput, TaskStop."""
        return [
            ToolSpec("Bash", BASH_DESCRIPTION, BASH_TOOL_SCHEMA),
            ToolSpec("TaskOutput", TASK_OUTPUT_DESCRIPTION, TASK_OUTPUT_SCHEMA),
            ToolSpec("TaskStop", TASK_STOP_DESCRIPTION, TASK_STOP_SCHEMA),
        ]

    def aliases(self) -> list[ToolSpec]:
        """The older names for TaskOutput and TaskStop: BashOutput and KillBash."""
        return [
            ToolSpec("BashOutput", BASH_OUTPUT_DESCRIPTION, BASH_OUTPUT_SCHEMA),
            ToolSpec("KillBash", KILL_BASH_DESCRIPTION, KILL_BASH_SCHEMA),
        ]
