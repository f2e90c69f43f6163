"""What bash runs before a call's command: the engine's lines, through BASH_ENV.

A call's limits (`ulimit`), its joining of its own cgroup (a plain spawn's) and, for a
session, the EXIT trap that records its final cwd and environment are bash lines that
must run before the command. They come in through `BASH_ENV`, not the command line, so
the process list shows `bash -c <the command>` exactly as the caller wrote it (and a
timeout notice lists what the caller ran): an anonymous file (memfd) holds the script,
bash sources it as `/dev/fd/N` (a fresh open, from its start), and the trap appends
what it records to that same descriptor. No path is involved, so it works inside a
sandbox, which hides the worker's directories, and for a `run_as` user, who can open
none of the worker's files. The script unsets `BASH_ENV` first, so the bash scripts the
command runs do not source it too.

One memfd and one small write per call (~10 us); bash reads it before the command.
"""

from __future__ import annotations

import os
import shlex


def trap_line(fd: int) -> str:
    """The EXIT trap that records the final cwd and environment into descriptor `fd`.

    It keeps the command's exit status (bash exits with the status the command had when
    the trap started).
    """
    trap = f"printf '%s\\0' \"$PWD\" >&{fd} 2>/dev/null; env -0 >&{fd} 2>/dev/null"
    return f"trap {shlex.quote(trap)} EXIT\n"


def startup_script(engine_lines: str, capture_fd: int | None) -> str:
    """The script bash sources before the command: BASH_ENV unset, the engine's lines
    (limits, cgroup), and with `capture_fd` the state trap."""
    trap = trap_line(capture_fd) if capture_fd is not None else ""
    return f"unset BASH_ENV\n{engine_lines}{trap}"


class Startup:
    """A call's startup script, in an anonymous file the call inherits as descriptor
    `fd_in_child`; after the script, what its state trap (if any) recorded."""

    def __init__(self, engine_lines: str, *, capture: bool, fd_in_child: int | None = None) -> None:
        """`fd_in_child`: the number the descriptor has in the call (None: the same)."""
        self.fd = os.memfd_create("bashfleet-startup", os.MFD_CLOEXEC)
        self.fd_in_child = self.fd if fd_in_child is None else fd_in_child
        self.capture = capture
        script = startup_script(engine_lines, self.fd_in_child if capture else None)
        self._size = os.write(self.fd, script.encode())  # the trap's writes go on from here

    @property
    def bash_env(self) -> str:
        """The call's BASH_ENV."""
        return f"/dev/fd/{self.fd_in_child}"

    def recorded(self) -> bytes | None:
        """What the state trap wrote (empty: it never ran); None without a capture."""
        if not self.capture:
            return None
        size = os.fstat(self.fd).st_size
        return os.pread(self.fd, max(0, size - self._size), self._size)

    def close(self) -> None:
        """Drop the file."""
        os.close(self.fd)
