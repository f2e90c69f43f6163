"""The messages between the worker and its sandbox processes, and the output cap watch.

Standard library only: the zygote and the workspace keepers (`isolate.launcher`,
`isolate.keeper`) run it as `python -I -S`, without the package's dependencies.

Messages are SOCK_SEQPACKET datagrams: one tag byte, then JSON, with descriptors
(SCM_RIGHTS) beside it; a body larger than one datagram travels in a memfd passed along
(the tag is then prefixed with `M`).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Required, TypedDict

# ------------------------------------------------------------ a keeper's messages
#
# What the worker asks a workspace's keeper, one message per request (its tag first),
# and what the keeper answers. A request with no fields (`X` exit when idle, `?` ping,
# `R` recycle) sends `{}`. Any request may be answered `E` (`ErrorAnswer`).


class JobTerms(TypedDict):
    """How the keeper records a job's end: its status file (`status`, a name in the
    folder whose descriptor comes with the message), the output cap (MiB) that stops it,
    and the seconds it may run."""

    status: str
    cap_mb: int | None
    timeout_s: float | None


class SpawnRequest(TypedDict, total=False):
    """`C`: start a call (or, with `job`, a background job) in the workspace, with the
    descriptors sent at the numbers `targets` names (then the job's status folder);
    answered `P` (`SpawnAnswer`) once it runs and `S` (`EndAnswer`) when it ends."""

    argv: Required[list[str]]
    cwd: Required[str]
    env: Required[dict[str, str]]
    targets: Required[list[int]]
    executable: str | None
    ctty: bool
    kill_grace_s: float | None
    recycle: bool
    output_cap: int | None
    file_size: int | None
    """RLIMIT_FSIZE (bytes, soft and hard) for the call, when no startup script of its
    sets it (`ulimit -f`)."""
    job: JobTerms


class AdoptRequest(JobTerms):
    """`A`: the running call becomes a job whose end the keeper records (its status
    folder's descriptor comes with it); answered `a`, or `E` when it ended first."""

    kill_grace_s: float


class SpawnAnswer(TypedDict):
    """`P`: the call runs: its pid in the workspace, on the host, and its start time
    (clock ticks after boot, None when it could not be read)."""

    pid: int
    host_pid: int
    start_ticks: int | None


class EndAnswer(TypedDict, total=False):
    """`S`: the call ended: its raw wait status, whether the output cap stopped it, and
    for a throwaway workspace's call (`recycle`: every process of the workspace ended
    before this was sent) that whether nothing of it is left follows (`K`)."""

    status: Required[int]
    capped: bool
    clean_follows: bool


class CleanAnswer(TypedDict):
    """`K`, after a throwaway workspace's call's `S`: whether nothing of the call is left
    in the workspace (it may serve another call)."""

    clean: bool


class ErrorAnswer(TypedDict, total=False):
    """`E`: the request failed: an errno, its message, the path it concerns."""

    errno: Required[int]
    message: Required[str]
    filename: str | None


class PingAnswer(TypedDict):
    """`!` (to `?`) and `v` (to a blank keeper's view, `V`): its pid in its namespace."""

    pid: int


class RecycleAnswer(TypedDict):
    """`r` (to `R`): whether nothing of the workspace's calls is left in it."""

    clean: bool


#: Largest message sent inline; larger ones travel in a memfd.
INLINE_LIMIT = 64 * 1024
_MAX_FDS = 16
_RECV_SIZE = INLINE_LIMIT + 1024


def send(sock: socket.socket, tag: bytes, body: Mapping[str, Any],
         fds: Sequence[int] = ()) -> None:
    """Send one message: a tag, a JSON body, and fds (SCM_RIGHTS)."""
    data = json.dumps(body, separators=(",", ":")).encode("utf-8", "surrogatepass")
    fds = list(fds)
    if len(data) > INLINE_LIMIT:
        fds.append(_memfd(data))
        try:
            _send_raw(sock, b"M" + tag, fds)
        finally:
            os.close(fds[-1])
        return
    _send_raw(sock, tag + data, fds)


def _send_raw(sock: socket.socket, data: bytes, fds: Sequence[int]) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("bashfleet-request", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return fd


def recv(sock: socket.socket) -> tuple[bytes, dict[str, Any], list[int]]:
    """Receive one message: (tag, body, fds); tag b"" at end of file.

    Received fds are close-on-exec (MSG_CMSG_CLOEXEC): nothing leaks into a spawn.
    """
    data, ancillary, _, _ = sock.recvmsg(
        _RECV_SIZE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
    )
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    if not data:
        close_all(received)
        return b"", {}, []
    if data[:1] == b"M":
        tag, memfd = data[1:2], received.pop()
        try:
            body = read_all_at(memfd)
        finally:
            os.close(memfd)
        return tag, json.loads(body.decode("utf-8", "surrogatepass")), received
    return data[:1], json.loads(data[1:].decode("utf-8", "surrogatepass")), received


def read_all_at(fd: int) -> bytes:
    """Everything in the file `fd` from its start (pread: its offset is left alone)."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def close_all(fds: Sequence[int]) -> None:
    """Close every fd, ignoring those already closed."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def error_body(exc: OSError) -> ErrorAnswer:
    """An `E` message's body for `exc`."""
    return {"errno": exc.errno or 5, "message": exc.strerror or str(exc),
            "filename": exc.filename}


# ------------------------------------------------------------------ a keeper's report

#: What a new keeper's helper and the keeper itself write on the report pipe, each a
#: line of its own: `pid N` (the helper), `ready` (the keeper), `error ERRNO TEXT`
#: (either). Two processes write it, so the order is not theirs to choose: under load
#: the keeper's `ready` came first, and a report read in order lost both ("the keeper
#: did not start" under a burst of calls, the keeper left running).


def report_line(kind: str, text: str = "") -> bytes:
    """One message of a keeper's report (a line: a pipe write this small is atomic)."""
    return (f"{kind} {text}" if text else kind).replace("\n", " ").encode() + b"\n"


def parse_report(data: bytes) -> tuple[int | None, bool, str]:
    """A keeper's report read whole: (its host pid or None, whether it said ready, the
    first error's text with its errno first, or "")."""
    pid: int | None = None
    ready = False
    error = ""
    for line in data.decode("utf-8", "replace").splitlines():
        kind, _, text = line.partition(" ")
        if kind == "pid" and text.strip().isdigit() and pid is None:
            pid = int(text)
        elif kind == "ready":
            ready = True
        elif kind == "error" and not error:
            error = text
    return pid, ready, error


# -------------------------------------------------------------------------- output cap

#: Bounds of the pause between two looks at the output size of a call with an output cap.
CAP_MIN_WAIT_S = 0.01
CAP_MAX_WAIT_S = 0.05


class CapWatch:
    """When to look at a call's output size next: half the time its output would take
    to reach the cap at the rate it grew since the last look, between 10 ms and 50 ms.
    `yes` writes 0.4-1.5 GB/s here: it is stopped within ~10 MB of the cap once seen
    writing, within ~75 MB when it starts after a quiet spell (with 0.25 s, 300 MB were
    measured). A quiet call costs 20 fstat and wake-ups a second, ~0.1 ms of CPU.
    The one output-cap rule: keepers, job supervisors, and the worker for calls it runs
    unsandboxed all use it."""

    def __init__(self, size: Callable[[], int], cap: int) -> None:
        self.measure = size
        self.cap = cap
        self.size = 0
        self.at = time.monotonic()

    def step(self) -> tuple[bool, float]:
        """(over the cap now, seconds to wait before the next step)."""
        previous, since = self.size, self.at
        self.size, self.at = self.measure(), time.monotonic()
        if self.size > self.cap:
            return True, 0.0
        rate = (self.size - previous) / max(1e-6, self.at - since)
        if rate <= 0:
            return False, CAP_MAX_WAIT_S
        return False, max(CAP_MIN_WAIT_S, min(CAP_MAX_WAIT_S, (self.cap - self.size) / rate / 2))


def files_size(fds: Sequence[int]) -> int:
    """Total size of the distinct files open as `fds` (stdout and stderr may be one)."""
    seen: dict[tuple[int, int], int] = {}
    for fd in fds:
        with contextlib.suppress(OSError):
            info = os.fstat(fd)
            seen[(info.st_dev, info.st_ino)] = info.st_size
    return sum(seen.values())


def returncode(status: int) -> int:
    """A raw wait status as Popen's returncode (negative: killed by that signal)."""
    return os.waitstatus_to_exitcode(status)
