"""A workspace's files, read and written as its calls would: by small tools run in it.

The worker never opens a workspace's files itself: a path a call could have turned into
a symlink to the worker's key would then be the worker's to follow. `cat`, `dd`, `stat`,
`mkdir`, `chmod` and `tar` run inside the workspace (as its run user, in its view, through
its keeper like any call), with the bytes passed on anonymous files (memfd). What they
can reach is what a call can: the owner and mode of what they write is a call's too.

    data, size = read_file(record, settings, "src/app.py", offset=0, limit=1 << 20)
    write_file(record, settings, "/tmp/x.txt", b"...", mode=0o644)

A transfer streams instead (`stream_tool`): `cat`, `dd` or `tar` in the workspace reads the
worker's pipe (an upload) or writes to it (a download), so no file of the size of the
data is ever held, and a download never passes through a file in the workspace, which
one of its commands could replace while it is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from dataclasses import dataclass
from typing import Any, Literal

from worker.engine import sandbox, workspaces
from worker.settings import Settings
from worker.wire.errors import ErrorKind, FileProblem
from worker.wire.models import WorkspaceRecord

#: Seconds a file tool may take (a 4 MiB chunk, a tar of a large tree).
TOOL_TIMEOUT_S = 300.0
#: The environment of the tools: nothing of the worker's.
TOOL_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C"}

_CHECK = (
    'f=$1; if [ ! -e "$f" ]; then echo "No such file or directory: $f" >&2; exit 2; fi; '
    'if [ -d "$f" ]; then echo "Is a directory: $f" >&2; exit 3; fi; '
    'if [ ! -r "$f" ]; then echo "Permission denied: $f" >&2; exit 4; fi; '
)
_READ = _CHECK + (
    'stat -L -c %s -- "$f" >&3 || exit 5; '
    'exec dd if="$f" iflag=skip_bytes,count_bytes skip="$2" count="$3" bs=1M status=none'
)
_WRITE = (
    'f=$1; d=$(dirname -- "$f"); '
    'if [ -d "$f" ]; then echo "Is a directory: $f" >&2; exit 3; fi; '
    'if [ -e "$d" ] && [ ! -d "$d" ]; then echo "Not a directory: $d" >&2; exit 6; fi; '
    'if [ "$4" != 1 ] && [ ! -d "$d" ]; then echo "No such file or directory: $d" >&2; exit 2; fi; '
    'if { [ -e "$f" ] && [ ! -w "$f" ]; } || { [ -d "$d" ] && [ ! -e "$f" ] && [ ! -w "$d" ]; }; '
    'then echo "Permission denied: $f" >&2; exit 4; fi; '
    'set -e; if [ "$4" = 1 ]; then mkdir -p -- "$d"; fi; '
    'if [ "$3" = 1 ]; then cat >> "$f"; else cat > "$f"; fi; '
    'if [ -n "$2" ]; then chmod -- "$2" "$f"; fi; stat -c %s -- "$f" >&3'
)
#: The tools of a transfer by (direction, kind): each takes the path (and an uploaded
#: file's mode) and reads its stdin or writes its stdout, the worker's pipe.
_STREAMS = {
    ("upload", "file"): _WRITE,
    ("download", "file"): _CHECK + 'stat -L -c %s -- "$f" >&3 || exit 5; '
                          'exec dd if="$f" bs=1M status=none',
    ("upload", "tree"): 'if [ -e "$1" ] && [ ! -d "$1" ]; then echo "Not a directory: $1" >&2; '
                        'exit 6; fi; set -e; mkdir -p -- "$1"; '
                        'tar -x -f - -C "$1" --no-same-owner; echo 0 >&3',
    ("download", "tree"): 'if [ ! -e "$1" ]; then echo "No such file or directory: $1" >&2; '
                          'exit 2; fi; if [ ! -d "$1" ]; then echo "Not a directory: $1" >&2; '
                          'exit 6; fi; exec tar -c -f - -C "$1" .',
}
#: A transfer's pipe: 4 MiB (a few chunks: the tool runs ahead while a chunk travels)
#: where the worker may (root), else Linux's pipe-max-size (1 MiB), rather than 64 KiB.
_PIPE_BYTES = (4 * 1024 * 1024, 1024 * 1024)
#: How a tool's exit status is told: no such file, a directory, not readable or writable,
#: a parent that is not a directory (the client raises the matching OSError).
_KINDS: dict[int, tuple[ErrorKind, FileProblem]] = {
    2: ("not_found", "missing"), 3: ("invalid", "directory"), 4: ("unauthorized", "denied"),
    6: ("invalid", "not_directory"),
}


class FileError(workspaces.WorkspaceError):
    """A file operation failed (its message is the tool's)."""


@dataclass(frozen=True)
class ToolRun:
    """How a tool ended and what it wrote (stdout, stderr, fd 3)."""

    status: int
    stdout: bytes
    stderr: bytes
    answer: bytes


def in_view(record: WorkspaceRecord, path: str) -> str:
    """A path as the workspace's calls see it: relative ones from its directory."""
    return os.path.normpath(os.path.join(record.path, path))


def read_file(record: WorkspaceRecord, settings: Settings, path: str, *, offset: int,
              limit: int) -> tuple[bytes, int]:
    """(`limit` bytes of the file from `offset`, its size)."""
    run = _checked(record, settings, [workspaces.shell_of(record), "-c", _READ, "read",
                                      in_view(record, path),
                                      str(offset), str(limit)], b"", limit)
    return run.stdout, int(run.answer.strip() or 0)


def write_file(record: WorkspaceRecord, settings: Settings, path: str, data: bytes, *,
               append: bool = False, mode: int | None = None,
               make_parents: bool = True) -> int:
    """Write (or append) `data`; the file's size after."""
    argv = [workspaces.shell_of(record), "-c", _WRITE, "write", in_view(record, path),
            "" if mode is None else format(mode, "o"), "1" if append else "0",
            "1" if make_parents else "0"]
    return int(_checked(record, settings, argv, data, 0).answer.strip() or 0)


def _checked(record: WorkspaceRecord, settings: Settings, argv: list[str], data: bytes,
             max_out: int) -> ToolRun:
    return _failed(run_tool(record, settings, argv, data, max_out=max_out))


def _failed(run: ToolRun) -> ToolRun:
    """`run`, or the FileError its exit status tells."""
    if run.status != 0:
        message = run.stderr.decode("utf-8", "replace").strip() or f"status {run.status}"
        kind, problem = _KINDS.get(run.status) or ("invalid", None)
        raise FileError(kind, message[-2000:], problem)
    return run


def run_tool(record: WorkspaceRecord, settings: Settings, argv: list[str], data: bytes, *,
             max_out: int) -> ToolRun:
    """Run `argv` in the workspace with `data` on its stdin; what it wrote. At most
    `max_out` bytes of stdout are kept (the tools are asked for no more)."""
    fds = [_memfd(data), _memfd(b""), _memfd(b""), _memfd(b"")]
    try:
        status = _run(record, settings, argv, fds)
        return ToolRun(status, _read(fds[1], max_out), _read(fds[2], 64 * 1024),
                       _read(fds[3], 4096))
    finally:
        for fd in fds:
            os.close(fd)


def _run(record: WorkspaceRecord, settings: Settings, argv: list[str], fds: list[int]) -> int:
    return _wait(_start(record, settings, argv, fds))


def _start(record: WorkspaceRecord, settings: Settings, argv: list[str], fds: list[int]
           ) -> Any:
    """Start a tool with `fds` as its 0-3; the process (`wait(timeout)`, `pid`)."""
    user = sandbox.run_user(settings)
    env = {**TOOL_ENV, "HOME": workspaces.home_of(user, record)}
    if record.keeper_pid is not None:
        return workspaces.start(record, {"argv": argv, "cwd": "/", "env": env,
                                         "targets": [0, 1, 2, 3]}, fds)
    # A plain spawn keeps the answer descriptor's own number (never a fixed one: this
    # process is threaded, its fd 3 is somebody's): the script moves it to 3 itself.
    plain = [*argv[:2], f"exec 3>&{fds[3]}; {argv[2]}", *argv[3:]]
    return subprocess.Popen(
        plain, stdin=fds[0], stdout=fds[1], stderr=fds[2], pass_fds=(fds[3],), env=env,
        cwd="/", start_new_session=True,
        user=user.uid if user else None, group=user.gid if user else None,
        extra_groups=sandbox.extra_groups(user) if user else None,
    )


def _wait(proc: Any) -> int:
    try:
        return int(proc.wait(TOOL_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        return int(proc.wait(10))


@dataclass
class StreamingTool:
    """A transfer's tool, running: it reads `fd`'s pipe (an upload: write to `fd`) or
    writes to it (a download: read `fd`)."""

    proc: Any
    fd: int
    """The worker's end of the tool's pipe."""
    outputs: list[int]
    """The tool's stderr and answer (memfds)."""

    def finish(self) -> int:
        """Close the pipe, wait for the tool; its answer (a number), or FileError."""
        self.close_pipe()
        try:
            status = _wait(self.proc)
            run = ToolRun(status, b"", _read(self.outputs[0], 64 * 1024),
                          _read(self.outputs[1], 4096))
        finally:
            for fd in self.outputs:
                os.close(fd)
            self.outputs = []
        return int(_failed(run).answer.strip() or 0)

    def close_pipe(self) -> None:
        """Close the worker's end (an upload's end of input)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def stream_tool(record: WorkspaceRecord, settings: Settings,
                direction: Literal["upload", "download"], kind: Literal["file", "tree"],
                path: str, *, mode: int | None = None) -> StreamingTool:
    """Start the tool that takes an upload in, or gives a download out, through a pipe."""
    script = _STREAMS[(direction, kind)]
    argv = [workspaces.shell_of(record), "-c", script, direction, in_view(record, path)]
    if (direction, kind) == ("upload", "file"):
        argv += ["" if mode is None else format(mode, "o"), "0", "1"]
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    for size in _PIPE_BYTES:
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, size)
            break
        except OSError:  # past pipe-max-size, without CAP_SYS_RESOURCE: the next
            continue
    ours, theirs = (write_end, read_end) if direction == "upload" else (read_end, write_end)
    stdio = [theirs, _memfd(b"")] if direction == "upload" else [_memfd(b""), theirs]
    outputs = [_memfd(b""), _memfd(b"")]
    try:
        proc = _start(record, settings, argv, [*stdio, *outputs])
    except BaseException:
        for fd in [ours, *outputs]:
            os.close(fd)
        raise
    finally:
        for fd in stdio:
            os.close(fd)
    return StreamingTool(proc, ours, outputs)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("bashfleet-file", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read(fd: int, limit: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, limit), 0) if limit else b""
