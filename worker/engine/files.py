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
import select
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Literal

from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.isolate import proto
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ErrorKind, FileProblem
from bashfleet.worker.wire.models import WorkspaceRecord

#: Seconds a file tool may take when its caller gives no deadline (a tar of a large tree).
TOOL_TIMEOUT_S = 300.0
#: The environment of the tools: nothing of the worker's.
TOOL_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C"}

# Only regular files are read or written. Opening a FIFO blocks until the other side
# comes (for ever, if the command that made it wants), and a device such as /dev/zero
# never ends: so the type is looked at first (`stat`, which opens nothing; `-L`: what a
# symlink leads to, since that is what would be opened), and refused at once (status 7).
# The file may still be swapped between that look and the open (a command renaming a
# FIFO over it): so dd opens with O_NONBLOCK (`nonblock`), under which a FIFO's open or
# read never waits (it fails or reads nothing), and reads at most the size it looked at
# (a device swapped in gives that many bytes, not an endless stream). The tools are the
# workspace's own, which its commands may replace by anything: what bounds a tool in the
# end is its deadline (`_wait` kills it), and a download's archive is checked by the
# client whatever wrote it. Busybox's dd has no `nonblock`: there the deadline alone.
_NONBLOCK = ('nb=nonblock,; dd if=/dev/null of=/dev/null iflag=nonblock count=0 '
             '2>/dev/null || nb=; ')
_CHECK = (
    'f=$1; if [ ! -e "$f" ]; then echo "No such file or directory: $f" >&2; exit 2; fi; '
    'if [ -d "$f" ]; then echo "Is a directory: $f" >&2; exit 3; fi; '
    'i=$(stat -L -c "%s %F" -- "$f") || exit 5; s=${i%% *}; t=${i#* }; '
    'case $t in "regular file"|"regular empty file") ;; '
    '*) echo "Not a regular file (a $t): $f" >&2; exit 7;; esac; '
    'if [ ! -r "$f" ]; then echo "Permission denied: $f" >&2; exit 4; fi; '
    + _NONBLOCK
)
_READ = _CHECK + (
    'echo "$s" >&3; '
    'exec dd if="$f" iflag=${nb}skip_bytes,count_bytes skip="$2" count="$3" bs=1M status=none'
)
_WRITE = (
    'f=$1; d=$(dirname -- "$f"); '
    'if [ -d "$f" ]; then echo "Is a directory: $f" >&2; exit 3; fi; '
    'if [ -e "$f" ] && [ ! -f "$f" ]; then '
    'echo "Not a regular file (a $(stat -L -c %F -- "$f")): $f" >&2; exit 7; fi; '
    'if [ -e "$d" ] && [ ! -d "$d" ]; then echo "Not a directory: $d" >&2; exit 6; fi; '
    'if [ "$4" != 1 ] && [ ! -d "$d" ]; then echo "No such file or directory: $d" >&2; exit 2; fi; '
    'if { [ -e "$f" ] && [ ! -w "$f" ]; } || { [ -d "$d" ] && [ ! -e "$f" ] && [ ! -w "$d" ]; }; '
    'then echo "Permission denied: $f" >&2; exit 4; fi; '
    + _NONBLOCK +
    'set -e; if [ "$4" = 1 ]; then mkdir -p -- "$d"; fi; '
    'o=; if [ -n "$nb" ]; then o=oflag=nonblock; fi; '
    'if [ "$3" = 1 ]; then dd of="$f" $o oflag=append conv=notrunc bs=1M status=none; '
    'else dd of="$f" $o bs=1M status=none; fi || { if [ -e "$f" ] && [ ! -f "$f" ]; then '
    'echo "Not a regular file (swapped in while written): $f" >&2; exit 7; fi; exit 1; }; '
    'if [ -n "$2" ]; then chmod -- "$2" "$f"; fi; stat -L -c %s -- "$f" >&3'
)
#: The tools of a transfer by (direction, kind): each takes the path (and an uploaded
#: file's mode) and reads its stdin or writes its stdout, the worker's pipe. A directory
#: travels as GNU tar writes it: a FIFO, a device or a socket in it is archived as what
#: it is (or skipped), never opened, and a file is opened O_NONBLOCK|O_NOFOLLOW and read
#: up to the size tar looked at; the client refuses an archive holding a FIFO or device.
_STREAMS = {
    ("upload", "file"): _WRITE,
    ("download", "file"): _CHECK + 'echo "$s" >&3; '
                          'exec dd if="$f" iflag=${nb}count_bytes count="$s" bs=1M status=none',
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
#: a parent that is not a directory, not a regular file (the client raises the matching
#: OSError).
_KINDS: dict[int, tuple[ErrorKind, FileProblem]] = {
    2: ("not_found", "missing"), 3: ("invalid", "directory"), 4: ("unauthorized", "denied"),
    6: ("invalid", "not_directory"), 7: ("invalid", "special"),
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
              limit: int, timeout: float = TOOL_TIMEOUT_S) -> tuple[bytes, int]:
    """(`limit` bytes of the regular file from `offset`, its size); FileError past
    `timeout` seconds (`timed_out`: the tool was killed)."""
    run = _checked(record, settings, [workspaces.shell_of(record), "-c", _READ, "read",
                                      in_view(record, path),
                                      str(offset), str(limit)], b"", max_out=limit,
                   timeout=timeout)
    return run.stdout, int(run.answer.strip() or 0)


def write_file(record: WorkspaceRecord, settings: Settings, path: str, data: bytes, *,
               append: bool = False, mode: int | None = None,
               make_parents: bool = True, timeout: float = TOOL_TIMEOUT_S) -> int:
    """Write (or append) `data` to a regular file (made if missing); the file's size
    after. FileError past `timeout` seconds (`timed_out`)."""
    argv = [workspaces.shell_of(record), "-c", _WRITE, "write", in_view(record, path),
            "" if mode is None else format(mode, "o"), "1" if append else "0",
            "1" if make_parents else "0"]
    run = _checked(record, settings, argv, data, max_out=0, timeout=timeout)
    return int(run.answer.strip() or 0)


def _checked(record: WorkspaceRecord, settings: Settings, argv: list[str], data: bytes, *,
             max_out: int, timeout: float) -> ToolRun:
    return _failed(run_tool(record, settings, argv, data, max_out=max_out, timeout=timeout))


def _failed(run: ToolRun) -> ToolRun:
    """`run`, or the FileError its exit status tells."""
    if run.status != 0:
        message = run.stderr.decode("utf-8", "replace").strip() or f"status {run.status}"
        kind, problem = _KINDS.get(run.status) or ("invalid", None)
        raise FileError(kind, message[-2000:], problem)
    return run


def run_tool(record: WorkspaceRecord, settings: Settings, argv: list[str], data: bytes, *,
             max_out: int, timeout: float = TOOL_TIMEOUT_S) -> ToolRun:
    """Run `argv` in the workspace with `data` on its stdin; what it wrote. At most
    `max_out` bytes of stdout are kept (the tools are asked for no more). FileError
    (`timed_out`) when it ran `timeout` seconds: it is killed then."""
    fds = [_memfd(data), _memfd(b""), _memfd(b""), _memfd(b"")]
    try:
        status = _wait(_start(record, settings, argv, fds), timeout)
        return ToolRun(status, _read(fds[1], max_out), _read(fds[2], 64 * 1024),
                       _read(fds[3], 4096))
    finally:
        for fd in fds:
            os.close(fd)


def _start(record: WorkspaceRecord, settings: Settings, argv: list[str], fds: list[int]
           ) -> Any:
    """Start a tool with `fds` as its 0-3; the process (`wait(timeout)`, `pid`)."""
    user = sandbox.run_user(settings)
    env = {**TOOL_ENV, "HOME": workspaces.home_of(user, record)}
    if record.keeper_pid is not None:
        return workspaces.start(record, proto.SpawnRequest(argv=argv, cwd="/", env=env,
                                                           targets=[0, 1, 2, 3]), fds,
                                settings=settings)
    # A plain spawn keeps the answer descriptor's own number (never a fixed one: this
    # process is threaded, its fd 3 is somebody's): the script moves it to 3 itself.
    plain = [*argv[:2], f"exec 3>&{fds[3]}; {argv[2]}", *argv[3:]]
    return subprocess.Popen(
        plain, stdin=fds[0], stdout=fds[1], stderr=fds[2], pass_fds=(fds[3],), env=env,
        cwd="/", start_new_session=True,
        user=user.uid if user else None, group=user.gid if user else None,
        extra_groups=sandbox.extra_groups(user) if user else None,
    )


def _wait(proc: Any, timeout: float) -> int:
    """The tool's exit status; FileError (`timed_out`) once it ran `timeout` seconds:
    its process group is killed then (whatever it waits on: a FIFO, a stalled mount)."""
    try:
        return int(proc.wait(max(timeout, 0.0)))
    except subprocess.TimeoutExpired:
        kill(proc)
    raise FileError("invalid", f"the file operation did not finish within {timeout:.0f} s "
                    "(the file blocked it, or the workspace's tool hung): it was stopped",
                    "timed_out")


def kill(proc: Any) -> None:
    """Kill a tool's process group, and reap it (a moment at most)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@dataclass
class StreamingTool:
    """A transfer's tool, running: it reads `fd`'s pipe (an upload: write to `fd`) or
    writes to it (a download: read `fd`)."""

    proc: Any
    fd: int
    """The worker's end of the tool's pipe (non-blocking: every wait on it is bounded)."""
    outputs: list[int]
    """The tool's stderr and answer (memfds)."""
    deadline: float | None = None
    """When (`time.monotonic()`) the transfer must be over; None: no bound but idleness."""

    def read_into(self, view: memoryview, idle_s: float) -> int:
        """Read the pipe until `view` is full or the tool closed it; the bytes read.
        FileError (`timed_out`, the tool killed) when it wrote nothing for `idle_s`."""
        size = 0
        while size < len(view):
            try:
                got = os.readv(self.fd, [view[size:]])
            except BlockingIOError:
                self._wait_for(select.POLLIN, idle_s, "wrote nothing")
                continue
            if not got:
                break
            size += got
        return size

    def write_all(self, data: memoryview, idle_s: float) -> None:
        """Write all of `data` to the pipe; FileError (`timed_out`, the tool killed)
        when it took nothing for `idle_s`."""
        view = data
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                self._wait_for(select.POLLOUT, idle_s, "read nothing")

    def _wait_for(self, event: int, idle_s: float, idle: str) -> None:
        left = idle_s if self.deadline is None else min(idle_s, self.deadline - time.monotonic())
        poller = select.poll()
        poller.register(self.fd, event)
        if poller.poll(max(left, 0.0) * 1000):
            return  # ready, or the other end closed: the next read or write says which
        kill(self.proc)
        over = self.deadline is not None and time.monotonic() >= self.deadline
        raise FileError("invalid", "the transfer ran past its deadline: it was stopped" if over
                        else f"the workspace's tool {idle} for {idle_s:.0f} s (a FIFO, a "
                        "stalled mount?): it was stopped", "timed_out")

    def finish(self, timeout: float = TOOL_TIMEOUT_S) -> int:
        """Close the pipe, wait for the tool (at most `timeout` s); its answer (a
        number), or FileError."""
        self.close_pipe()
        try:
            status = _wait(self.proc, timeout)
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
    os.set_blocking(ours, False)
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
