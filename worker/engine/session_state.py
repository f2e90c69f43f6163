"""Carry shell state between stateless calls: the environment and cwd a command ends with.

Every call is a fresh `bash -c`, yet seed 004 (FR-009) wants exported variables to
persist across calls of a session. With `Call.capture_state`, the command runs behind
an EXIT trap that writes `$PWD` and `env -0` to a state file; the worker diffs that
against the environment the command started with and returns the changes, which the
session applies to its next call.

Limits, by construction: only exported variables persist (as with any environment);
a command that replaces the shell (`exec prog`) or sets its own EXIT trap records
nothing, and the session keeps its previous state.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from worker.engine.environment import HARDENING, MARKER_VAR

#: Variables bash itself maintains: never carried between calls.
_SHELL_OWNED = frozenset({"_", "SHLVL", "PWD", "OLDPWD", MARKER_VAR})


def wrap_command(command: str, state_path: str | None = None, *, fd: int | None = None) -> str:
    """The command behind an EXIT trap that records its final cwd and environment, into
    the file `state_path`, or into the open file `fd` (the engine's way: a sandboxed or
    `run_as` call cannot open the worker's spill directory, so the worker opens the file
    and passes it in).

    The trap keeps the command's exit status (bash exits with the status the command
    had when the trap started), and the command stays on a line of its own.
    """
    if fd is not None:
        first = then = f">&{fd}"
    else:
        target = shlex.quote(state_path or "/dev/null")
        first, then = f"> {target}", f">> {target}"
    trap = f"printf '%s\\0' \"$PWD\" {first} 2>/dev/null; env -0 {then} 2>/dev/null"
    return f"trap {shlex.quote(trap)} EXIT\n{command}"


@dataclass(frozen=True)
class FinalState:
    """What a command left behind, relative to the environment it started with."""

    cwd: str
    changes: dict[str, str]
    removed: tuple[str, ...]


def parse_state(data: bytes, started_with: Mapping[str, str]) -> FinalState | None:
    """Diff a state file against the starting environment; None when it is unusable."""
    if not data:
        return None
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    cwd, entries = fields[0], [field for field in fields[1:] if field]
    final: dict[str, str] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        if sep and name:
            final[name] = value
    skip = _SHELL_OWNED | set(HARDENING)
    changes = {
        name: value
        for name, value in final.items()
        if name not in skip and started_with.get(name) != value
    }
    removed = tuple(
        sorted(name for name in started_with if name not in final and name not in skip)
    )
    return FinalState(cwd=cwd, changes=changes, removed=removed)
