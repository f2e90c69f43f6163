"""Carry shell state between stateless calls: the environment and cwd a command ends with.

Every call is a fresh `bash -c`, yet the claude dialect wants exported variables to
persist across calls of a session. With `Call.capture_state`, bash sets an EXIT trap
before the command runs that writes `$PWD` and `env -0` to a state file; the worker
diffs that against the environment the command started with and returns the changes,
which the session applies to its next call.

The trap comes in through `BASH_ENV`, not the command line (`bashfleet.worker.engine.startup`),
and what it records comes back through a descriptor; this module reads it.

Limits, by construction: only exported variables persist (as with any environment);
a command that replaces the shell (`exec prog`) or sets its own EXIT trap records
nothing, and the session keeps its previous state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bashfleet.worker.engine.environment import MARKER_VAR

#: Variables bash itself (or this capture) maintains: never carried between calls.
_SHELL_OWNED = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "BASH_ENV", MARKER_VAR})


@dataclass(frozen=True)
class FinalState:
    """What a command left behind, relative to the environment it started with."""

    cwd: str
    changes: dict[str, str]
    removed: tuple[str, ...]


def parse_state(data: bytes, started_with: Mapping[str, str]) -> FinalState | None:
    """Diff what the trap recorded against the starting environment; None when it is
    unusable (empty: the trap never ran)."""
    if not data.startswith(b"/"):
        return None
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    cwd, entries = fields[0], [field for field in fields[1:] if field]
    final: dict[str, str] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        if sep and name:
            final[name] = value
    # The hardening (PAGER=cat...) is diffed like any variable: it is a default, so a
    # session's `unset PAGER` or `export PAGER=less` holds on its later calls.
    skip = _SHELL_OWNED
    changes = {
        name: value
        for name, value in final.items()
        if name not in skip and started_with.get(name) != value
    }
    removed = tuple(
        sorted(name for name in started_with if name not in final and name not in skip)
    )
    return FinalState(cwd=cwd, changes=changes, removed=removed)
