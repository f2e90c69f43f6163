"""How a background job's end is recorded: its status file and the lines appended to
its output. One implementation for every watcher of a job (a workspace's keeper, an
interactive session's supervisor, the worker's checks).

Standard library only: the keepers and job supervisors run it as `python -I -S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid


def completion_line(returncode: int) -> str:
    """The modes dialect's "[background process completed]" or "[background process
    failed: STATUS]", STATUS as Rust's ExitStatus prints it."""
    if returncode == 0:
        return "\n\n[background process completed]\n"
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "?"
        return f"\n\n[background process failed: signal: {number} ({name})]\n"
    return f"\n\n[background process failed: exit status: {returncode}]\n"


def cap_notice(cap_mb: int | None) -> str:
    """The line appended to a job's output when its output cap stopped it."""
    return f"\n[bashfleet: the output passed this host's cap of {cap_mb} MiB; the job was stopped]"


def cap_note(cap_mb: int | None) -> str:
    """The note of a job's status when its output cap stopped it."""
    return f"stopped: its output passed this host's cap of {cap_mb} MiB"


def status_json(returncode: int | None, note: str | None = None) -> str:
    """The status file's content (the fields of `bashfleet.worker.wire.models.JobStatus`)."""
    return json.dumps({
        "exit_code": returncode if returncode is not None and returncode >= 0 else None,
        "signal": -returncode if returncode is not None and returncode < 0 else None,
        "ended_at": time.time(),
        "note": note,
    })


def write_status(name: str, returncode: int | None, note: str | None = None, *,
                 replace: bool = True, dir_fd: int | None = None) -> None:
    """Write the status file `name` atomically (relative to `dir_fd` when given: a keeper
    cannot see the state directory, it holds a descriptor of it).

    `replace`: overwrite what is recorded (the job's own watcher, which knows the truth);
    without it the status is linked into place only if none exists yet, so that writers
    that race (a check, a kill, the watcher) never undo the watcher's.
    """
    tmp = f"{name}.{uuid.uuid4().hex}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(status_json(returncode, note))
        if replace:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def append_end(out_fd: int, returncode: int, capped: bool, cap_mb: int | None) -> None:
    """Append the cap notice (when the cap stopped it) and the completion line."""
    text = (cap_notice(cap_mb) if capped else "") + completion_line(returncode)
    with contextlib.suppress(OSError):
        os.write(out_fd, text.encode())
