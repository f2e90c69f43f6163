"""Tool dialects: each one a bash tool as an agent knows it (schemas, defaults, result
text), run over one fleet.

    from bashfleet.client.dialects import get_dialect, schemas

    dialect = get_dialect("pipe")
    schemas(dialect)                                  # the tool schemas a model sees
    dialect.call("bash", {"command": "ls"}, fleet, session)

| name          | tools                                                        |
|---------------|--------------------------------------------------------------|
| `pipe`        | bash {command, timeout, check_pid, kill_pid}                 |
| `modes`       | bash {command, mode} (default 30 s, slow 15 min, background) |
| `pi`          | bash {command, timeout, cwd, head, tail}                     |
| `claude`      | Bash, BashOutput, KillBash (Claude Code's older tool names)  |
| `claude-code` | Bash, TaskOutput, TaskStop (Claude Code's tools of today)    |
| `native`      | bash, bash_check, bash_kill, bash_write (bashfleet's own)    |
| `codex`       | exec_command, write_stdin (OpenAI Codex CLI's unified exec)  |
"""

from __future__ import annotations

from bashfleet.client.dialects.base import (
    Artifact,
    Dialect,
    MemorySessionStore,
    RefusalError,
    Runner,
    RunnerError,
    RunRecord,
    SessionJob,
    SessionState,
    SessionStore,
    ToolSpec,
    ToolText,
    schemas,
)
from bashfleet.client.dialects.claude import ClaudeDialect
from bashfleet.client.dialects.claude_code import ClaudeCodeDialect
from bashfleet.client.dialects.codex import CodexDialect
from bashfleet.client.dialects.modes import ModesDialect, humanize_bytes
from bashfleet.client.dialects.native import NativeDialect
from bashfleet.client.dialects.pi import PiDialect
from bashfleet.client.dialects.pipe import PipeDialect

#: Every dialect by name; each class builds with no arguments.
DIALECTS: dict[str, type[Dialect]] = {
    cls.name: cls
    for cls in (PipeDialect, ModesDialect, PiDialect, ClaudeDialect, ClaudeCodeDialect,
                NativeDialect, CodexDialect)
}


class UnknownDialectError(ValueError):
    """A dialect name that is not in DIALECTS."""


def get_dialect(name: str) -> Dialect:
    """A dialect by name, with its default options."""
    try:
        return DIALECTS[name]()
    except KeyError:
        known = ", ".join(sorted(DIALECTS))
        raise UnknownDialectError(f"unknown dialect {name!r}; known dialects: {known}") from None


__all__ = [
    "DIALECTS",
    "Artifact",
    "ClaudeCodeDialect",
    "ClaudeDialect",
    "CodexDialect",
    "Dialect",
    "MemorySessionStore",
    "ModesDialect",
    "NativeDialect",
    "PiDialect",
    "PipeDialect",
    "RefusalError",
    "RunRecord",
    "Runner",
    "RunnerError",
    "SessionJob",
    "SessionState",
    "SessionStore",
    "ToolSpec",
    "ToolText",
    "UnknownDialectError",
    "get_dialect",
    "humanize_bytes",
    "schemas",
]
