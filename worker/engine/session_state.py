"""Carry shell state between stateless calls: the environment and cwd a command ends with.

Every call is a fresh `bash -c`, yet seed 004 (FR-009) wants exported variables to
persist across calls of a session. With `Call.capture_state`, bash sets an EXIT trap
before the command runs that writes `$PWD` and `env -0` to a state file; the worker
diffs that against the environment the command started with and returns the changes,
which the session applies to its next call.

The trap comes in through `BASH_ENV`, not the command line (the process list shows
`bash -c <the command>` as the caller wrote it): an anonymous file (`StateCapture`, a
memfd) holds the script, bash sources it as `/dev/fd/N`, and the trap appends what it
records to that same descriptor. No path is involved, so it works inside a sandbox,
which hides the worker's directories, and for a `run_as` user, who could open none of
the worker's files. The script unsets `BASH_ENV` first, so the bash scripts the command
runs do not source it too.

Limits, by construction: only exported variables persist (as with any environment);
a command that replaces the shell (`exec prog`) or sets its own EXIT trap records
nothing, and the session keeps its previous state.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from worker.engine.environment import HARDENING, MARKER_VAR

#: Variables bash itself (or this capture) maintains: never carried between calls.
_SHELL_OWNED = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "BASH_ENV", MARKER_VAR})


def startup_script(fd: int) -> str:
    """What bash sources before the command (`BASH_ENV=/dev/fd/<fd>`): an EXIT trap that
    records the final cwd and environment into descriptor `fd`.

    The trap keeps the command's exit status (bash exits with the status the command
    had when the trap started).
    """
    trap = f"printf '%s\\0' \"$PWD\" >&{fd} 2>/dev/null; env -0 >&{fd} 2>/dev/null"
    return f"unset BASH_ENV\ntrap {shlex.quote(trap)} EXIT\n"


class StateCapture:
    """A call's state capture: an anonymous file holding the startup script (bash reads
    it through `/dev/fd/<fd_in_child>`: a fresh open, from its start) and, after it,
    what the script's trap writes through the inherited descriptor."""

    def __init__(self, fd_in_child: int | None = None) -> None:
        """`fd_in_child`: the number the descriptor has in the call (None: the same)."""
        self.fd = os.memfd_create("bashfleet-state", os.MFD_CLOEXEC)
        self.fd_in_child = self.fd if fd_in_child is None else fd_in_child
        self._script = startup_script(self.fd_in_child).encode()
        os.write(self.fd, self._script)  # the trap's writes go on from here

    @property
    def bash_env(self) -> str:
        """The call's BASH_ENV."""
        return f"/dev/fd/{self.fd_in_child}"

    def recorded(self) -> bytes:
        """What the trap wrote (empty when it never ran)."""
        size = os.fstat(self.fd).st_size
        return os.pread(self.fd, max(0, size - len(self._script)), len(self._script))

    def close(self) -> None:
        """Drop the file."""
        os.close(self.fd)


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
