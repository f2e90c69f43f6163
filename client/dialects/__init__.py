"""Tool dialects: each seed's bash tool (schemas, defaults, result text) over one fleet.

    from bashfleet.client.dialects import get_dialect, schemas

    dialect = get_dialect("pipe")
    schemas(dialect)                                  # the tool schemas a model sees
    dialect.call("bash", {"command": "ls"}, fleet, session)

| name     | seed      | tools                                  |
|----------|-----------|----------------------------------------|
| `pipe`   | 000       | bash {command, timeout, check_pid, kill_pid} |
| `modes`  | 001 + 003 | bash {command, mode}                   |
| `pi`     | 002       | bash {command, timeout, cwd, head, tail} |
| `claude` | 004       | Bash, BashOutput, KillBash             |
| `claude-code` | ours | Bash, TaskOutput, TaskStop (Claude Code's tools of today) |
| `native` | ours      | bash, bash_check, bash_kill, bash_write |
| `codex`  | specs     | exec_command, write_stdin              |
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
