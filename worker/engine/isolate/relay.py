"""An interactive session's supervisor loop: the process that holds its stdin.

Standard library only, and no package imports: the job supervisor
(`bashfleet.worker.engine.isolate.job_supervisor`, started detached by `jobs.start_job`) loads this
file by path when a job's spec asks for stdin (`closed`, `pipe` or `pty`). The supervisor
outlives the worker that started the job, so the end that writes to the job's stdin (a
pipe's write end, or the PTY's master) lives where a write can reach it later, from any
consumer of the host, also after the worker restarted.

    worker (control consumer) ──unix socket──► supervisor ──pipe / PTY master──► bash
                                                   │ (PTY) master's output
                                                   ▼
                                               output file (the job's, on disk)

The socket is `<state>/jobs/<job id>.sock`, mode 0600 in the worker's state directory,
which no sandboxed call can see. Requests and answers are SOCK_SEQPACKET datagrams of
JSON (`{"op": "write", "data_b64": ...}` -> `{"ok": true, "written": N}`; `close`,
`resize`, `state`, `touch`; `{"error": KIND, "message": ...}` when refused).

A PTY's output is one stream: the supervisor copies the master's output into the job's
output file as it comes (never held in memory beyond one read), counting it against the
host's output cap. With a pipe, stdout and stderr go straight to the file as for any job.
A session nobody wrote to or read from, and that printed nothing, for `idle_s` is ended.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from typing import Any

#: Bytes of input a session holds for a process that does not read them yet.
MAX_PENDING = 4 * 1024 * 1024
#: Bytes read from a PTY master at a time.
READ_CHUNK = 65536
#: Longest socket path bind/connect take directly (sun_path is 108 bytes).
MAX_SOCKET_PATH = 100
#: Seconds between two looks at the output size, for caps the supervisor watches.
CAP_TICK_S = 0.1
#: Seconds given to the last output of a PTY once its process ended.
DRAIN_S = 0.5


def _by_path(path: str, use: Callable[[str], None]) -> None:
    """`use(path)` (a socket's connect or bind), through /proc/self/fd when the path is
    longer than a socket address holds."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        use(path)
        return
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_CLOEXEC)
    try:
        use(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    finally:
        os.close(folder)


def connect(path: str, timeout: float = 5.0) -> socket.socket:
    """A client connection to a session's socket (a long path through /proc/self/fd)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        _by_path(path, sock.connect)
    except OSError:
        sock.close()
        raise
    return sock


def request(path: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One request to a session's supervisor and its answer."""
    with connect(path, timeout) as sock:
        sock.send(json.dumps(body).encode())
        data = sock.recv(65536)
    if not data:
        raise ConnectionResetError(errno.ECONNRESET, "the session's supervisor went away")
    answer: dict[str, Any] = json.loads(data)
    return answer


def _listen(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        _by_path(path, sock.bind)
    finally:
        os.umask(old)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def _nonblocking(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


def set_size(fd: int, rows: int, cols: int) -> None:
    """The terminal's window size (the kernel sends SIGWINCH to its foreground group)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Session:
    """The supervisor's side of one interactive job."""

    def __init__(self, spec: dict[str, Any], out_fd: int) -> None:
        self.spec = spec
        self.mode: str = spec["stdin"]
        self.out_fd = out_fd
        self.master = -1
        self.stdin_w = -1
        self.child_fds: list[int] = []
        self.pending = bytearray()
        self.close_after_flush = False
        self.output_bytes = 0
        self.last_activity = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.clients: set[socket.socket] = set()
        self.ended_by: str | None = None

    # ------------------------------------------------------------------ setup

    def stdio(self) -> tuple[tuple[int, int, int], list[int] | None]:
        """The child's fds 0, 1, 2, and the (st_dev, st_ino) of its stdin."""
        if self.mode == "pty":
            self.master, slave = os.openpty()
            rows, cols = self.spec.get("term_size") or (24, 80)
            set_size(slave, rows, cols)
            _nonblocking(self.master)
            self.child_fds = [slave]
            info = os.fstat(slave)
            return (slave, slave, slave), [info.st_dev, info.st_ino]
        if self.mode == "pipe":
            read_end, self.stdin_w = os.pipe2(os.O_CLOEXEC)
            _nonblocking(self.stdin_w)
            self.child_fds = [read_end]
            info = os.fstat(read_end)
            return (read_end, self.out_fd, self.out_fd), [info.st_dev, info.st_ino]
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.child_fds = [null]
        return (null, self.out_fd, self.out_fd), None

    def started(self) -> None:
        """The child has its ends: close ours (EOF and EIO then mean the child's end)."""
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = []

    @property
    def stdin_open(self) -> bool:
        """True while writes reach the process."""
        return self.master >= 0 or (self.stdin_w >= 0 and not self.close_after_flush)

    # ------------------------------------------------------------------- input

    def write(self, data: bytes) -> dict[str, Any]:
        if not self.stdin_open:
            return {"error": "closed", "message": "stdin is closed for this session"}
        if len(self.pending) + len(data) > MAX_PENDING:
            return {"error": "full", "message": (
                f"the process has not read the {len(self.pending)} bytes of input it was "
                f"given; at most {MAX_PENDING} wait for it")}
        self.pending += data
        self._flush()
        return {"ok": True, "written": len(data), "pending": len(self.pending)}

    def _target(self) -> int:
        return self.master if self.master >= 0 else self.stdin_w

    def _flush(self) -> None:
        fd = self._target()
        while self.pending and fd >= 0:
            try:
                done = os.write(fd, self.pending[:READ_CHUNK])
            except BlockingIOError:
                break
            except OSError:
                # The process closed its end (EPIPE) or the terminal hung up (EIO).
                self.pending.clear()
                self._close_pipe()
                return
            del self.pending[:done]
        if not self.pending and self.close_after_flush:
            self._close_pipe()
        self._watch_writes()

    def _watch_writes(self) -> None:
        fd = self._target()
        if fd < 0:
            return
        events = selectors.EVENT_WRITE if self.pending else 0
        if fd == self.master:
            events |= selectors.EVENT_READ
        key = self.sel.get_map().get(fd)
        if key is None and events:
            self.sel.register(fd, events, "stdin")
        elif key is not None and not events:
            self.sel.unregister(fd)
        elif key is not None:
            self.sel.modify(fd, events, key.data)

    def _close_pipe(self) -> None:
        if self.stdin_w >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.stdin_w)
            os.close(self.stdin_w)
            self.stdin_w = -1
        self.close_after_flush = False

    def close(self) -> dict[str, Any]:
        """EOF: a pipe is closed once what waits in it is written; a terminal gets its
        EOF character (Ctrl-D), as a person would type it."""
        if self.master >= 0:
            eof = termios.tcgetattr(self.master)[6][termios.VEOF]
            return self.write(eof if isinstance(eof, bytes) else bytes([eof]))
        if self.stdin_w < 0:
            return {"ok": True, "written": 0}
        self.close_after_flush = True
        self._flush()
        return {"ok": True, "written": 0}

    def resize(self, rows: int, cols: int) -> dict[str, Any]:
        if self.master < 0:
            return {"error": "invalid", "message": "this session has no terminal to resize"}
        set_size(self.master, rows, cols)
        return {"ok": True}

    # ------------------------------------------------------------------ output

    def read_master(self) -> bool:
        """Copy what the PTY has into the output file; False once it hung up."""
        try:
            data = os.read(self.master, READ_CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""  # EIO: no process holds the terminal any more
        if not data:
            return False
        view = memoryview(data)
        while view:
            view = view[os.write(self.out_fd, view):]
        self.output_bytes += len(data)
        self.last_activity = time.monotonic()
        return True

    def drain(self, seconds: float) -> None:
        """The PTY's last output, once its process ended (others may still hold it)."""
        if self.master < 0:
            return
        deadline = time.monotonic() + seconds
        poller = selectors.DefaultSelector()
        poller.register(self.master, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not poller.select(max(0.0, deadline - time.monotonic())):
                break
            if not self.read_master():
                break
        poller.close()

    # ---------------------------------------------------------------- requests

    def serve(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536 * 2 + 4096)
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        self.last_activity = time.monotonic()
        try:
            answer = self.answer(json.loads(data))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            answer = {"error": "invalid", "message": f"bad request: {exc}"}
        with contextlib.suppress(OSError):
            client.send(json.dumps(answer).encode())

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        op = body.get("op")
        if op == "write":
            return self.write(base64.b64decode(body.get("data_b64", "")))
        if op == "close":
            return self.close()
        if op == "resize":
            return self.resize(int(body["rows"]), int(body["cols"]))
        if op in ("state", "touch"):
            return {"ok": True, "stdin_open": self.stdin_open, "pending": len(self.pending)}
        return {"error": "invalid", "message": f"unknown operation {op!r}"}

    def _drop(self, client: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(client)
        self.clients.discard(client)
        client.close()

    # -------------------------------------------------------------------- loop

    def run(self, proc: Any, listener: socket.socket, exit_fd: int) -> None:
        """Serve the session until its process ends (or a limit ends it)."""
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        self.sel.register(exit_fd, selectors.EVENT_READ, "exit")
        if self.master >= 0:
            self.sel.register(self.master, selectors.EVENT_READ, "stdin")
        limits = _Limits(self.spec, self)
        while True:
            for key, mask in self.sel.select(limits.pause()):
                if key.data == "exit":
                    return
                self._event(key, mask, listener)
            reason = limits.passed()
            if reason is not None:
                self.ended_by = reason
                _stop(proc, float(self.spec.get("kill_grace_s") or 0), self)
                return

    def _event(self, key: selectors.SelectorKey, mask: int, listener: socket.socket) -> None:
        if key.data == "listen":
            with contextlib.suppress(BlockingIOError):
                client, _ = listener.accept()
                client.setblocking(True)
                client.settimeout(5.0)
                self.clients.add(client)
                self.sel.register(client, selectors.EVENT_READ, "client")
        elif key.data == "client":
            self.serve(key.fileobj)  # type: ignore[arg-type]
        elif key.data == "stdin":
            if mask & selectors.EVENT_READ and self.master >= 0 and not self.read_master():
                self.sel.unregister(self.master)
                os.close(self.master)
                self.master = -1
                self.pending.clear()
                return
            if mask & selectors.EVENT_WRITE:
                self._flush()

    def finish(self) -> None:
        for client in list(self.clients):
            self._drop(client)
        self._close_pipe()
        if self.master >= 0:
            os.close(self.master)
            self.master = -1


class _Limits:
    """The session's idle limit, background timeout and output cap."""

    def __init__(self, spec: dict[str, Any], session: Session) -> None:
        self.session = session
        timeout = spec.get("timeout_s")
        self.deadline = None if timeout is None else time.monotonic() + float(timeout)
        idle = spec.get("idle_s")
        self.idle_s = None if idle is None else float(idle)
        cap = spec.get("output_cap")
        self.cap = None if cap is None else int(cap)
        # A sandboxed pipe session's runner watches its output file itself.
        self.watch_file = self.cap is not None and session.mode != "pty" and not spec.get(
            "sandbox")

    def pause(self) -> float | None:
        waits = []
        now = time.monotonic()
        if self.deadline is not None:
            waits.append(self.deadline - now)
        if self.idle_s is not None:
            waits.append(self.session.last_activity + self.idle_s - now)
        if self.watch_file:
            waits.append(CAP_TICK_S)
        return max(0.0, min(waits)) if waits else None

    def passed(self) -> str | None:
        now = time.monotonic()
        if self.cap is not None:
            size = self.session.output_bytes
            if self.watch_file:
                size = os.fstat(self.session.out_fd).st_size
            if size > self.cap:
                return "output"
        if self.deadline is not None and now >= self.deadline:
            return "timeout"
        if self.idle_s is not None and now - self.session.last_activity >= self.idle_s:
            return "idle"
        return None


def _stop(proc: Any, grace_s: float, session: Session) -> None:
    """SIGTERM the group, then SIGKILL after the grace (output keeps flowing meanwhile)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        deadline = time.monotonic() + (grace_s if signum == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            try:
                proc.wait(0.05)
                return
            except subprocess.TimeoutExpired:
                if session.master >= 0:
                    session.drain(0.0)


def _exit_fd(proc: Any) -> tuple[int, bool]:
    """(fd readable once the job ended, whether we close it)."""
    if hasattr(proc, "exit_fd"):
        return proc.exit_fd(), False
    return os.pidfd_open(proc.pid), True


def _notice(reason: str | None, spec: dict[str, Any]) -> str:
    if reason == "idle":
        return (f"\n[bashfleet: the session was ended after {spec.get('idle_s'):g}s without "
                "input or output (the host's idle limit)]")
    if reason == "output":
        return (f"\n[bashfleet: the output passed this host's cap of "
                f"{spec.get('output_cap_mb')} MiB; the job was stopped]")
    return ""


def main(
    spec: dict[str, Any],
    start: Callable[..., tuple[Any, float]],
    write_status: Callable[..., None],
    remove_groups: Callable[..., None],
) -> int:
    """Start the job with its stdin, report it, serve it to its end, record the end."""
    out_fd = os.open(spec["output_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    session = Session(spec, out_fd)
    try:
        listener = _listen(spec["socket_path"])
        stdio, stdin_id = session.stdio()
        proc, started = start(spec, out_fd, stdio, session.mode == "pty")
    except OSError as exc:
        print(json.dumps({"error": f"could not start bash: {exc}"}), flush=True)
        remove_groups(spec, timeout=0)
        return 1
    finally:
        session.started()
    print(json.dumps({"pid": proc.pid, "pgid": proc.pid, "start_time": started,
                      "stdin_id": stdin_id, "ns_pid": getattr(proc, "ns_pid", None)}),
          flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    exit_fd, owned = _exit_fd(proc)
    try:
        session.run(proc, listener, exit_fd)
        returncode = int(proc.wait())
    finally:
        if owned:
            os.close(exit_fd)
    session.drain(DRAIN_S)
    capped = session.ended_by == "output" or bool(getattr(proc, "capped", False))
    with open(spec["output_path"], "a", encoding="utf-8") as handle:
        # No completion line (a check's): a session's readers get its status instead.
        handle.write(_notice("output" if capped else session.ended_by, spec))
    os.close(out_fd)
    notes = {"output": f"stopped: its output passed this host's cap of "
             f"{spec.get('output_cap_mb')} MiB",
             "idle": f"ended after {spec.get('idle_s')}s without input or output"}
    write_status(spec["status_path"], returncode,
                 notes.get("output" if capped else session.ended_by or ""))
    with contextlib.suppress(OSError):
        os.unlink(spec["socket_path"])
    listener.close()
    session.finish()
    remove_groups(spec)
    return 0
