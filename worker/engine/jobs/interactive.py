"""Interactive sessions: a call whose process keeps its stdin (a pipe or a PTY) open.

    result = run_call(Call(call_id="c1", command="python3 -i", stdin="pty", timeout_s=5))
    record = jobs.load_record(result.job.id)
    out = exchange(record, b"1+1\\n", offset=result.read_offset, collect=Collect(wait_s=2))

Such a call is a job of its own supervisor from the start (`jobs.start_job`; the loop is
`bashfleet.worker.engine.isolate.relay`), so its stdin outlives the worker; the call waits at most
its timeout (its *yield*) and returns earlier when the process ends or waits for input.
Every read returns the output produced since the offset it is given: the fleet keeps
that offset per job, so reads by any client of the owner never repeat nor skip a byte.

"Waiting for input": a process of the job sleeping in a read of its stdin or terminal
(or in select / an infinite poll / epoll watching it), found from /proc (its syscall,
else its wait channel), while the job printed nothing for `input_wait_s`. The last line
it printed is its prompt.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import platform
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bashfleet.worker.engine import procs
from bashfleet.worker.engine.isolate import relay
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.capture import PLAIN, _clean, escape_boundary
from bashfleet.worker.engine.output.sanitize import redact, utf8_boundary
from bashfleet.worker.engine.secrets import worker_redaction
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.control import Collect, SessionOutput
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import (
    Call,
    CallResult,
    InputWait,
    JobRecord,
    Spill,
    TailLines,
    WorkspaceRecord,
)

#: Seconds between two looks for output: short at first (a reply to a keystroke comes
#: in a millisecond or two), longer while the process is quiet.
POLL_FIRST_S = 0.001
POLL_MAX_S = 0.05
#: Seconds between two looks at what a quiet process is blocked on (a /proc scan).
INPUT_SCAN_S = 0.25
#: Seconds a job whose process is gone gets for its supervisor to record the end.
END_GRACE_S = 2.0
#: Bytes of the output's end read for the prompt.
PROMPT_READ = 4096
#: Longest prompt shown.
PROMPT_CHARS = 300


class SessionError(ToolError):
    """An interactive session refused a request (closed stdin, not a terminal...)."""


# ----------------------------------------------------------------- waiting for input

_SYSCALLS = {
    # machine: (read-like, select-like, poll, ppoll, epoll-wait-like)
    "x86_64": ({0, 17, 19}, {23, 270}, {7}, {271}, {232, 281, 441}),
    "aarch64": ({63, 65, 67}, {72}, set(), {73}, {22, 441}),
}
_READ_CHANNELS = {"wait_woken", "n_tty_read", "anon_pipe_read", "pipe_read", "pipe_wait",
                  "pipe_wait_readable"}
_INFINITE = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


#: /dev/tty (5, 0): a process of a PTY session that opens it reads the session's terminal
#: (ssh-keygen and sudo ask for passwords there, not on stdin).
_DEV_TTY = os.makedev(5, 0)


def _fd_is(pid: int, fd: int, stdin_id: tuple[int, int]) -> bool:
    """True when `fd` of `pid` is the session's stdin (a pipe or its terminal), or the
    /dev/tty of a process whose controlling terminal that is."""
    try:
        info = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    if (info.st_dev, info.st_ino) == tuple(stdin_id):
        return True
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == _DEV_TTY and _ctty_is(pid, stdin_id)


def _ctty_is(pid: int, stdin_id: tuple[int, int]) -> bool:
    """True when `pid`'s controlling terminal is the session's (its fd 0, 1 or 2 is)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            info = os.stat(f"/proc/{pid}/fd/{fd}")
            if (info.st_dev, info.st_ino) == tuple(stdin_id):
                return True
    return False


def _epoll_watches(pid: int, epfd: int, stdin_id: tuple[int, int]) -> bool:
    """True when epoll instance `epfd` of `pid` waits for the stdin to be readable."""
    try:
        text = Path(f"/proc/{pid}/fdinfo/{epfd}").read_text("ascii", "replace")
    except OSError:
        return False
    for match in re.finditer(r"^tfd:\s*(\d+)\s+events:\s*([0-9a-f]+)", text, re.M):
        if int(match.group(2), 16) & 1 and _fd_is(pid, int(match.group(1)), stdin_id):
            return True
    return False


def reads_input(pid: int, stdin_id: tuple[int, int], machine: str | None = None) -> bool:
    """True when `pid` sleeps waiting to read `stdin_id` (its pipe or terminal)."""
    stat = procs.read_stat(pid)
    if stat is None or stat.state != "S":
        return False
    calls = _SYSCALLS.get(machine or platform.machine())
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text("ascii").split()
    except OSError:
        fields = []
    if calls is not None and fields and fields[0].isdigit():
        return syscall_reads(pid, int(fields[0]), [int(f, 16) for f in fields[1:7]],
                             stdin_id, calls)
    # No syscall to read (not permitted): the wait channel of a pipe or tty read.
    try:
        channel = Path(f"/proc/{pid}/wchan").read_text("ascii").strip()
    except OSError:
        return False
    return channel in _READ_CHANNELS and _fd_is(pid, 0, stdin_id)


def syscall_reads(
    pid: int, number: int, args: list[int], stdin_id: tuple[int, int],
    calls: tuple[set[int], set[int], set[int], set[int], set[int]],
) -> bool:
    """Whether a process sleeping in syscall `number` with `args` waits for its stdin."""
    reads, selects, polls, ppolls, epolls = calls
    if number in reads:
        return _fd_is(pid, args[0], stdin_id)
    if number in selects:
        # select(nfds, ...): the highest fd watched is nfds - 1 (a REPL: select(1, ...)).
        return args[0] >= 1 and _fd_is(pid, args[0] - 1, stdin_id)
    if number in polls:
        return args[1] == 1 and args[2] in _INFINITE and _fd_is(pid, 0, stdin_id)
    if number in ppolls:
        return args[1] == 1 and args[2] == 0 and _fd_is(pid, 0, stdin_id)
    if number in epolls:
        return _epoll_watches(pid, args[0], stdin_id)
    return False


def prompt_of(path: str, secrets: re.Pattern[str] | None) -> str:
    """The last line a job printed (sanitized), its prompt when it waits for input."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = os.pread(handle.fileno(), PROMPT_READ, max(0, size - PROMPT_READ))
    except OSError:
        return ""
    text = _clean(data, secrets)
    lines = [line for line in text.split("\n") if line.strip()]
    return lines[-1][-PROMPT_CHARS:] if lines else ""


def input_wait(record: JobRecord, idle_s: float, secrets: re.Pattern[str] | None
               ) -> InputWait | None:
    """The job's process that waits for input, if one does (None without a stdin)."""
    if record.stdin_id is None:
        return None
    for pid in procs.find_call_processes(record.pgid, record.marker):
        if reads_input(pid, record.stdin_id):
            found = procs.describe([pid])
            command = found[0].command if found else ""
            # Its pid as the calls of its workspace see it (what a model would kill).
            return InputWait(idle_s=round(idle_s, 3), prompt=prompt_of(record.output_path,
                             secrets), pid=procs.ns_pid(pid), command=command)
    return None


# ---------------------------------------------------------------------------- reading


@dataclass
class _Read:
    text: str
    raw: bytes
    end: int
    more: bool


def read_new(path: str, offset: int, max_bytes: int, secrets: re.Pattern[str] | None,
             *, final: bool) -> _Read:
    """The output from `offset`: never ending inside a UTF-8 character or an escape
    sequence (the rest comes with the next read) unless the job ended (`final`)."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = os.pread(handle.fileno(), min(max_bytes, max(0, size - offset)), offset)
    except OSError:
        return _Read("", b"", offset, False)
    more = offset + len(data) < size
    if data and (more or not final):
        cut = utf8_boundary(data)
        data = data[: escape_boundary(data[:cut]) if cut else 0]
    return _Read(_clean(data, secrets, PLAIN), redact_bytes(data, secrets), offset + len(data),
                 more)


def redact_bytes(data: bytes, secrets: re.Pattern[str] | None) -> bytes:
    """The bytes as written (for a person's terminal), with the worker's secrets redacted
    as in any text it shows: raw does not mean unredacted."""
    if secrets is None or not data:
        return data
    text = data.decode("utf-8", "surrogateescape")
    return redact(text, secrets).encode("utf-8", "surrogateescape")


# -------------------------------------------------------------------------- collecting


@dataclass
class _State:
    running: bool
    exit_code: int | None = None
    signal: int | None = None
    note: str | None = None


def _state(record: JobRecord, gone_since: list[float]) -> _State:
    """Whether the job runs, from its status file (written once its output is complete)."""
    status = jobs.read_status(record)
    if status is None:
        if procs.is_same_process(record.pid, record.start_time):
            return _State(True)
        # The supervisor records the end moments after the process: give it that time.
        if not gone_since:
            gone_since.append(time.monotonic())
        if time.monotonic() - gone_since[0] < END_GRACE_S:
            return _State(True)
        jobs.write_status(record, None, note="ended while no supervisor was alive; exit "
                          "status unknown")
        status = jobs.read_status(record)
    if status is None:  # pragma: no cover - written just above
        return _State(False)
    return _State(False, status.exit_code, status.signal, status.note)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def collect(
    record: JobRecord, offset: int, spec: Collect, settings: Settings, *,
    cancelled: Callable[[], bool] | None = None, written: int = 0,
    last_output: float | None = None,
) -> SessionOutput:
    """Wait for output as `spec` says, then read what the job produced since `offset`;
    `cancelled()` turning true ends the wait at once."""
    secrets = worker_redaction(settings)
    if spec.delay_s:
        time.sleep(spec.delay_s)  # the codex rule: let the process react to a write
    started = time.monotonic()
    deadline = started + spec.wait_s
    size = _size(record.output_path)
    seen = size
    last = last_output if last_output is not None else started
    if size > offset:
        last = min(last, started)
    gone: list[float] = []
    pause = POLL_FIRST_S
    next_scan = started + spec.input_wait_s
    waiting: InputWait | None = None
    while True:
        state = _state(record, gone)
        now = time.monotonic()
        size = _size(record.output_path)
        if size != seen:
            seen, last, pause = size, now, POLL_FIRST_S
        if not state.running or (cancelled is not None and cancelled()):
            break
        if spec.settle_s is not None and size > offset and now - last >= spec.settle_s:
            break
        if now - last >= spec.input_wait_s and now >= next_scan:
            waiting = input_wait(record, now - last, secrets)
            if waiting is not None:
                break
            next_scan = now + INPUT_SCAN_S
        if now >= deadline:
            break
        time.sleep(min(pause, max(0.0, deadline - now)))
        pause = min(pause * 2, POLL_MAX_S)
    read = read_new(record.output_path, offset, spec.max_bytes, secrets,
                    final=not state.running)
    cut = truncate.apply(read.text, spec.truncation or TailLines())
    stdin_open = state.running and record.stdin in ("pipe", "pty")
    if stdin_open and record.socket_path:
        stdin_open = _stdin_open(record)
    return SessionOutput(
        id=record.id, host=record.host, running=state.running, exit_code=state.exit_code,
        signal=state.signal, stdin=record.stdin, stdin_open=stdin_open, output=cut.text,
        output_truncation=cut.info,
        raw_b64=base64.b64encode(read.raw).decode() if spec.raw else None,
        offset=read.end, start_offset=offset, more=read.more,
        input_wait=waiting if state.running else None, written=written,
        output_path=record.output_path, note=state.note,
    )


def _stdin_open(record: JobRecord) -> bool:
    try:
        answer = _ask(record, {"op": "state"})
    except SessionError:
        return False
    return bool(answer.get("stdin_open"))


# ----------------------------------------------------------------------------- writing


def _ask(record: JobRecord, body: dict[str, object]) -> dict[str, object]:
    """One request to the job's supervisor; SessionError when it is gone or refuses."""
    if not record.socket_path or record.stdin == "null":
        raise SessionError("invalid", f"job {record.id} is not an interactive session: it "
                           "has no stdin to write to")
    try:
        answer = relay.request(record.socket_path, body)
    except (OSError, ValueError) as exc:
        raise SessionError("not_found", f"session {record.id} has ended (its supervisor "
                           f"does not answer: {exc})") from None
    if "error" in answer:
        message = str(answer.get("message") or answer["error"])
        if answer["error"] == "full":
            raise SessionError("unavailable", message)
        raise SessionError("invalid", message)
    return answer


#: Bytes handed to a supervisor per request (a datagram of the socket: ~64 KiB of base64).
WRITE_CHUNK = 48 * 1024
#: Seconds a big write waits, chunk by chunk, for a process that reads its input slowly.
WRITE_PATIENCE_S = 10.0


def write(record: JobRecord, data: bytes) -> int:
    """Hand `data` to the job's stdin (through its terminal for a PTY); bytes taken.
    A write of at most WRITE_CHUNK bytes is taken whole or not at all."""
    if record.stdin == "closed" and data:
        raise SessionError("invalid", "stdin is closed for this session")
    if not data:
        with contextlib.suppress(SessionError):
            _ask(record, {"op": "touch"})  # a poll keeps an idle session alive
        return 0
    written = 0
    while written < len(data):
        chunk = data[written: written + WRITE_CHUNK]
        _write_chunk(record, chunk, first=written == 0)
        written += len(chunk)
    return written


def _write_chunk(record: JobRecord, chunk: bytes, *, first: bool) -> None:
    """One chunk; past the first, a full input buffer is waited out (what came before
    was taken: failing now would make the caller send it twice)."""
    deadline = time.monotonic() + WRITE_PATIENCE_S
    body: dict[str, object] = {"op": "write", "data_b64": base64.b64encode(chunk).decode()}
    while True:
        try:
            _ask(record, body)
            return
        except SessionError as exc:
            if first or exc.kind != "unavailable" or time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # the process reads its input: give it a moment


def close(record: JobRecord) -> None:
    """End the job's input: EOF on its pipe, Ctrl-D on its terminal."""
    if record.stdin == "closed":
        return
    _ask(record, {"op": "close"})


def resize(record: JobRecord, rows: int, cols: int) -> None:
    """Set the job's terminal size."""
    if record.stdin != "pty":
        raise SessionError("invalid", f"session {record.id} has no terminal to resize")
    _ask(record, {"op": "resize", "rows": rows, "cols": cols})


# ---------------------------------------------------------------------------- starting


def running_sessions(settings: Settings, owner: str) -> list[JobRecord]:
    """The owner's interactive sessions that run on this host: those whose supervisor's
    socket is still there (it removes it at the end), their process alive. Only those
    records are read, not every job's the host keeps."""
    found = []
    for socket_path in sorted(settings.jobs_dir.glob("*.sock")):
        with contextlib.suppress(jobs.JobError, OSError, ValueError):
            record = jobs.load_record(socket_path.stem, settings)
            if (record.owner == owner and jobs.read_status(record) is None
                    and procs.is_same_process(record.pid, record.start_time)):
                found.append(record)
    return found


def start(call: Call, cwd: str, settings: Settings, workspace: WorkspaceRecord) -> JobRecord:
    """Start an interactive session (refused past the owner's cap on this host)."""
    live = running_sessions(settings, call.owner)
    if len(live) >= settings.interactive_max_per_owner:
        ids = ", ".join(record.id for record in live[:10])
        raise SessionError("invalid", (
            f"{len(live)} interactive sessions of this owner run on host {settings.host}, "
            f"the most allowed (interactive_max_per_owner); end one first ({ids})"))
    try:
        return jobs.start_job(call, cwd, settings, workspace)
    except jobs.JobError as exc:
        raise SessionError(exc.kind, exc.message) from exc


def run(call: Call, cwd: str, settings: Settings, workspace: WorkspaceRecord, *,
        started: float, cancelled: Callable[[], bool] | None = None) -> CallResult:
    """Start the session, wait its yield (the call's timeout; 0 in the background), and
    return what it printed meanwhile; a session still running is a job one writes to."""
    record = start(call, cwd, settings, workspace)
    if call.background:
        # Started to be read later (a terminal attached, a stdin forwarded): nothing is
        # read now, so the first read gets the output from its first byte.
        out = SessionOutput(id=record.id, host=record.host, running=True, stdin=record.stdin,
                            stdin_open=record.stdin in ("pipe", "pty"))
        return session_result(call, record, out, cwd, started=started, settings=settings)
    wait = call.timeout_s if call.timeout_s is not None else call.policy.default_timeout_s
    spec = Collect(wait_s=min(wait, 300.0), input_wait_s=call.input_wait_s,
                   truncation=call.policy.truncation)
    with _reader_lock(settings, record.id):
        out = collect(record, 0, spec, settings, cancelled=cancelled)
        if cancelled is not None and cancelled() and out.running:
            jobs.kill_job(record, grace_s=call.policy.kill_grace_s, settings=settings)
            out = collect(record, out.offset, Collect(), settings)
        save_offset(settings, record.id, out.offset)
    return session_result(call, record, out, cwd, started=started, settings=settings)


def session_result(call: Call, record: JobRecord, out: SessionOutput, cwd: str, *,
                   started: float, settings: Settings) -> CallResult:
    """A session's first answer as a call's result."""
    return CallResult(
        call_id=call.call_id, host=settings.host, exit_code=out.exit_code, signal=out.signal,
        backgrounded=out.running, combined=True, stdout=out.output,
        stdout_truncation=out.output_truncation, job=jobs.handle(record),
        spill=Spill(host=settings.host, stdout_path=record.output_path,
                    stdout_bytes=_size(record.output_path)),
        duration_s=time.monotonic() - started, cwd=cwd, input_wait=out.input_wait,
        read_offset=out.offset,
    )


# ------------------------------------------------------------------ exchanges (the fleet)


def _offset_path(settings: Settings, job_id: str) -> Path:
    return settings.jobs_dir / f"{job_id}.read"


@contextlib.contextmanager
def _reader_lock(settings: Settings, job_id: str) -> Iterator[Path]:
    """One reader of a session at a time (threads and processes of the host): every byte
    goes to exactly one read."""
    path = _offset_path(settings, job_id)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def load_offset(settings: Settings, job_id: str) -> int:
    """Where the last read of a session stopped (0 before any)."""
    try:
        return int(_offset_path(settings, job_id).read_text("ascii") or 0)
    except (OSError, ValueError):
        return 0


def save_offset(settings: Settings, job_id: str, offset: int) -> None:
    """Remember where the last read of a session stopped (on the host's disk, atomically)."""
    path = _offset_path(settings, job_id)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(str(offset), encoding="ascii")
    os.replace(tmp, path)


def exchange(
    settings: Settings, record: JobRecord, data: bytes, spec: Collect, *, close_input: bool = False,
) -> SessionOutput:
    """Write `data` (and EOF with `close_input`) to a session, then read its new output
    since the last read by anyone: what the fleet's write_stdin / close_stdin do."""
    written, note = 0, None
    try:
        written = write(record, data)
        if close_input:
            close(record)
    except SessionError as exc:
        # A process that ended since the last read: its last output and status are
        # still worth more than an error.
        if exc.kind != "not_found" or jobs.read_status(record) is None:
            raise
        note = "the input was not delivered: the process had ended"
    if not spec.read:
        return SessionOutput(id=record.id, host=record.host, running=True, stdin=record.stdin,
                             stdin_open=record.stdin in ("pipe", "pty"), written=written,
                             offset=load_offset(settings, record.id),
                             output_path=record.output_path)
    with _reader_lock(settings, record.id):
        out = collect(record, load_offset(settings, record.id), spec, settings,
                      written=written)
        save_offset(settings, record.id, out.offset)
    return out.model_copy(update={"note": note}) if note else out
