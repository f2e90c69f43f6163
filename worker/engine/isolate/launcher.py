"""The zygote that forks workspace keepers, and the worker's side of both.

Standard library only: the zygote runs as `python -I -S .../isolate/bootstrap.py launcher
FD` (`isolate.command`) inside bubblewrap (which gives a worker that is not root the user
namespace it needs to make the others), and imports its siblings (`proto`, `kernel`,
`view`, `keeper`, `job_end`) as in the worker.

    worker (a consumer) ──socketpair──► bwrap ─► zygote      one per worker process
                                                   │ fork (helper): unshare PID, mount,
                                                   │ IPC (network), join the cgroup,
                                                   │ fork, exit
                                                   ▼
                                                 keeper (pid 1 of the workspace's
                                                   namespaces; outlives the worker)
                                                   │ posix_spawn, per call and job
                                                   ▼
                                                 bash -c COMMAND

Why a zygote (measured on this 2-core machine): a Python process takes ~22 ms to start,
a fork of a warm one ~0.5 ms. A workspace is ready for its first call in a few
milliseconds (its keeper is a fork; its mount view a few dozen mount calls), and its
keeper's pages are the zygote's until written (a frozen heap, no collector).

On the zygote's channel, worker -> zygote: `N` (a new keeper: its spec, then its
listening socket and the cgroup procs files as fds), answered by `R` {pid} (the keeper's
host pid, once its view is built) or `E`; `W` {userns} (wake a sleeping workspace: a
pidfd of its holder, the connection the holder answered `Z` on, then what came with the
`Z`: its listening socket, the service's spec, its user namespace when `userns`; then
the cgroup procs files), answered by `R` {pid} (the new service's host pid) or `E`.
Every request carries an `id`, which its answer repeats (and may carry `setup_s`, the
deadline of its report, KEEPER_SETUP_S when absent): the zygote serves requests side
by side (a helper forked per request, the reports read as they come, each with its own
deadline) and answers each when its keeper is ready, in whatever order that is.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bashfleet.worker.engine.isolate import keeper, kernel, proto

#: Where a call finds the fd of its state file (sessions), and a plain job those of its
#: cgroup's procs files: high numbers, which scripts (3-9) and bash itself (10 and up,
#: moved out of the way of open fds) leave alone.
STATE_FD = 200
CGROUP_FD = 201
#: Seconds a new keeper gets to build its view and report: ~5 ms on an idle host, seconds
#: when a thousand calls start at once on two cores; a slow start is better than a
#: failed call.
KEEPER_SETUP_S = 30.0


# ---------------------------------------------------------------------------- zygote



def readable(fd: int, timeout: float) -> bool:
    """Whether `fd` has something to read (or its other end closed) within `timeout`
    seconds. poll(2), never select(2): a process with many calls at once holds
    descriptors past select's 1024, where glibc aborts the whole process."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(max(0.0, timeout) * 1000))

@dataclass
class _Pending:
    """A helper forked for one request, its report (and its keeper's) still coming."""

    rid: object
    """The request's id, which its answer carries."""
    report: int
    """The read end of the report pipe (the helper and the keeper hold the write end)."""
    helper: int
    """A pidfd of the helper (killed when it does not report in time), or -1."""
    deadline: float
    chunks: list[bytes]


def _new_keeper(body: dict[str, Any], fds: list[int], inherited: Sequence[int]) -> _Pending:
    """Fork a helper that makes a keeper in new namespaces; its report comes later.
    `inherited`: the zygote's fds a helper must not keep (other requests' reports)."""
    # The last fd of a blank with host ids is its slot's lock: inherited by the keeper,
    # which holds it for its life; never a cgroup's procs file.
    listener, cgroup_fds = fds[0], fds[1:-1] if body["spec"].get("slot") else fds[1:]
    spec: dict[str, Any] = body["spec"]
    maker = -1
    try:
        # OSError when the worker process that asked is gone already (a blank made as it
        # stopped): a keeper made now would watch no one and live for ever.
        maker = _maker_fd(spec)
        spec = {**spec, "maker_fd": maker}
        if body["spec"].get("slot"):
            spec["slot_fd"] = fds[-1]  # a holder that replaces the keeper holds it on
        return _fork_helper(body, inherited,
                            lambda report: _helper(spec, listener, cgroup_fds, report))
    finally:
        # The helper has its copies: a lock on the slot's file is held by the keeper's.
        proto.close_all([*fds] + ([maker] if maker >= 0 else []))


def _fork_helper(body: Mapping[str, Any], inherited: Sequence[int],
                 run: Callable[[int], None]) -> _Pending:
    """Fork a helper that runs `run(write end of its report pipe)` and exits."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        helper = os.fork()
        if helper == 0:  # pragma: no cover - the child exits
            proto.close_all([read_end, *inherited])
            run(write_end)
    except OSError:
        proto.close_all([read_end])
        raise
    finally:
        if write_end >= 0:
            os.close(write_end)
    try:
        pidfd = os.pidfd_open(helper)
    except OSError:  # it exited (and was reaped) already: nothing to kill later
        pidfd = -1
    setup_s = float(body.get("setup_s") or KEEPER_SETUP_S)
    return _Pending(body.get("id"), read_end, pidfd, time.monotonic() + setup_s, [])


def _maker_fd(spec: dict[str, Any]) -> int:
    """A pidfd of the worker process that asks for a blank keeper (its `maker`), which
    the keeper inherits and watches until claimed (or for good, `bound_to_maker`: the
    sandbox's probe); -1 for a workspace's keeper built at once. OSError when the maker
    is gone already (or not a pid)."""
    if not spec.get("maker") or (spec.get("plan") is not None
                                 and not spec.get("bound_to_maker")):
        return -1
    try:
        return os.pidfd_open(int(spec["maker"]))
    except ValueError:
        raise OSError(errno.EINVAL, f"not a maker pid: {spec['maker']!r}") from None


def _helper(spec: dict[str, Any], listener: int, cgroup_fds: list[int], report: int) -> None:
    """In the helper child: new namespaces, the workspace's cgroup, then fork the keeper
    (pid 1 of the new PID namespace), report its pid, exit. The extra fork (~0.5 ms) is
    what unshare(CLONE_NEWPID) asks: only the children of its caller are in the new
    namespace."""
    code = 1
    try:
        flags = kernel.CLONE_NEWNS | kernel.CLONE_NEWPID | kernel.CLONE_NEWIPC
        if not spec.get("network", True):
            flags |= kernel.CLONE_NEWNET
        kernel.unshare(flags)
        # Into the workspace's cgroup once: the keeper and every call are born there.
        for fd in cgroup_fds:
            os.write(fd, b"0")
        _fork_keeper(lambda: keeper.main(spec, listener, report), report)
        code = 0
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.write(report, proto.report_line("error", f"{exc.errno or errno.EIO} {exc}"))
    finally:
        os._exit(code)


def _fork_keeper(run: Callable[[], int], report: int) -> None:
    """In a helper: fork the keeper, which runs `run` and exits with what it returns
    (a bug in it is reported, never a hang of the worker), and report its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        gc.enable()
        try:
            code = run()
        except BaseException as exc:  # a bug: say it, never hang the worker
            with contextlib.suppress(OSError):
                os.write(report, proto.report_line(
                    "error", f"{errno.EIO} keeper failed: {exc!r}"))
        finally:
            os._exit(code)
    os.write(report, proto.report_line("pid", str(pid)))


def _wake_keeper(body: dict[str, Any], fds: list[int], inherited: Sequence[int]) -> _Pending:
    """Fork a helper that forks a service into a sleeping workspace's namespaces (its
    holder's); its report comes later."""
    count = 4 + bool(body.get("userns")) + bool(body.get("userns") and body.get("spawner"))
    try:
        if len(fds) < count:
            raise OSError(errno.EPROTO, "a wake without its descriptors")
        return _fork_helper(body, inherited,
                            lambda report: _wake_helper(fds[:count], fds[count:], report))
    finally:
        proto.close_all(fds)


def _wake_helper(given: list[int], cgroup_fds: list[int], report: int) -> None:
    """In the helper child: read the service's spec, open what must come from the host
    (its /proc, /dev/null), enter the holder's namespaces, join the workspace's cgroup,
    fork the service (whose parent, once this helper exits, is the holder), exit."""
    code = 1
    try:
        pidfd, link, listener, spec_fd = given[:4]
        userns = given[4] if len(given) > 4 else -1
        spawner = given[5] if len(given) > 5 else -1
        service = json.loads(proto.read_all_at(spec_fd))
        seccomp = keeper.syscall_filter_for(service)
        host_proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        flags = kernel.CLONE_NEWNS | kernel.CLONE_NEWPID | kernel.CLONE_NEWIPC
        if not service.get("network", True):
            flags |= kernel.CLONE_NEWNET
        kernel.setns(pidfd, flags)
        for fd in cgroup_fds:
            os.write(fd, b"0")
        wake_fds = keeper.WakeFds(listener=listener, userns=userns, link=link,
                                  host_proc=host_proc, null=null, spawner=spawner)
        _fork_keeper(lambda: keeper.wake(service, wake_fds, seccomp, report), report)
        code = 0
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            os.write(report, proto.report_line(
                "error", f"{getattr(exc, 'errno', None) or errno.EIO} {exc}"))
    finally:
        os._exit(code)


def _answer_report(chan: socket.socket, rid: object, answer: bytes) -> None:
    """`R` {pid} for a keeper (or service) that reported ready, else `E` with its reason
    (a keeper that started and failed is killed, ending the namespaces it made); both
    carry the request's id."""
    pid, ready, error = proto.parse_report(answer)
    if pid is not None and ready and not error:
        proto.send(chan, b"R", {"pid": pid, "id": rid})
        return
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    number, _, reason = error.partition(" ")
    code = int(number) if number.isdigit() else errno.EIO
    proto.send(chan, b"E", {"errno": code, "message": reason or "the keeper did not start",
                            "id": rid})


def zygote_main(fd: int) -> int:
    """Serve the zygote channel `fd` until the worker closes it: each request forks its
    helper at once, and is answered when its report is whole (or its time is up), so
    keepers are made side by side and answered in the order they get ready."""
    chan = socket.socket(fileno=fd)
    chan.set_inheritable(False)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    # Helpers are reaped by the kernel (keepers are not our children: they are reparented).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # Fewer copy-on-write faults in the keepers: the collector never touches (writes)
    # the objects that exist now.
    gc.disable()
    gc.freeze()
    pending: dict[int, _Pending] = {}
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        for ready, _ in poller.poll(_poll_ms(pending.values())):
            if ready != fd:
                _read_some(chan, poller, pending, ready)
            elif not _serve_one(chan, poller, pending):
                proto.close_all(list(pending))
                return 0
        now = time.monotonic()
        for late in [p for p in pending.values() if p.deadline <= now]:
            late.chunks.append(b"\n" + proto.report_line(
                "error", f"{errno.ETIMEDOUT} the keeper did not report within its setup time"))
            _finish(chan, poller, pending, late)


def _poll_ms(pending: Iterable[_Pending]) -> int:
    """How long the zygote may wait for a message: until the first report's deadline."""
    first = min((p.deadline for p in pending), default=None)
    return -1 if first is None else max(0, int((first - time.monotonic()) * 1000) + 1)


def _serve_one(chan: socket.socket, poller: select.poll, pending: dict[int, _Pending]) -> bool:
    """Read one request and fork its helper (or answer `E` at once); False at the end of
    the channel."""
    tag, body, fds = proto.recv(chan)
    if tag == b"":
        return False
    if tag not in (b"N", b"W"):
        proto.close_all(fds)
        return True
    try:
        start = _new_keeper if tag == b"N" else _wake_keeper
        # The helper (and its keeper) keep none of the zygote's own fds.
        job = start(body, fds, [chan.fileno(), *pending])
    except OSError as exc:
        proto.send(chan, b"E", {**proto.error_body(exc), "id": body.get("id")})
        return True
    pending[job.report] = job
    poller.register(job.report, select.POLLIN | select.POLLHUP | select.POLLERR)
    return True


def _read_some(chan: socket.socket, poller: select.poll, pending: dict[int, _Pending],
               fd: int) -> None:
    """What a helper or keeper wrote; the answer once both closed their end."""
    job = pending[fd]
    chunk = os.read(fd, 4096)
    if chunk:
        job.chunks.append(chunk)
    else:
        _finish(chan, poller, pending, job)


def _finish(chan: socket.socket, poller: select.poll, pending: dict[int, _Pending],
            job: _Pending) -> None:
    """Answer a request from its report, and let go of its pipe and helper (killed if it
    is still there: one that never reported is stuck)."""
    poller.unregister(job.report)
    del pending[job.report]
    os.close(job.report)
    if job.helper >= 0:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(job.helper, signal.SIGKILL)
        os.close(job.helper)
    _answer_report(chan, job.rid, b"".join(job.chunks))


# ------------------------------------------------------------------------ worker side


class SandboxError(OSError):
    """The sandbox could not make a workspace or start a call (not the command's failure)."""


class KeeperLostError(SandboxError):
    """A keeper (or the zygote) went away: the workspace ended, or it was never there."""


class KeeperAsleepError(SandboxError):
    """The workspace sleeps: its holder answered (`Z`) with what wakes it (`fds`:
    listener, the service's spec, its user namespace when there is one), on a connection
    the waking service must hold. Nothing sent on that connection was read."""

    def __init__(self, fds: list[int]) -> None:
        super().__init__(errno.EAGAIN, "the workspace sleeps")
        self.fds = fds


def expect(sock: socket.socket, tags: bytes, timeout: float | None,
           what: str) -> tuple[bytes, dict[str, Any], list[int]]:
    """The next message on `sock`, one of `tags`; SandboxError for `E` or silence."""
    sock.settimeout(timeout)
    try:
        tag, body, fds = proto.recv(sock)
    except TimeoutError:
        raise SandboxError(errno.ETIMEDOUT, f"no answer from the {what}") from None
    except OSError as exc:
        raise KeeperLostError(errno.EPIPE, f"the {what} went away: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(None)
    return judge(tag, body, fds, tags, what)


def judge(tag: bytes, body: dict[str, Any], fds: list[int], tags: bytes,
          what: str) -> tuple[bytes, dict[str, Any], list[int]]:
    """A message received, if it is one of `tags`; else the SandboxError it means (its
    fds closed): the end of the channel, `E`, or a sleeping keeper's `Z`."""
    if tag == b"":
        raise KeeperLostError(errno.EPIPE, f"the {what} went away")
    if tag == b"Z" and b"Z" not in tags:
        raise KeeperAsleepError(fds)
    if tag == b"E":
        proto.close_all(fds)
        raise SandboxError(body.get("errno", errno.EIO), body.get("message", "failed"),
                           body.get("filename"))
    if tag not in tags:
        proto.close_all(fds)
        raise SandboxError(errno.EPROTO, f"unexpected answer {tag!r} from the {what}")
    return tag, body, fds


class _Waiter:
    """One request to the zygote, waiting for its answer (set by the channel's reader)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: tuple[bytes, dict[str, Any], list[int]] = (b"", {}, [])


class LauncherClient:
    """The worker's end of a zygote: `argv` runs it (bwrap ... -- python bootstrap.py launcher),
    with the channel's fd number appended. Safe to use from many threads at once: each
    request has an id, and one reader thread hands each answer to the thread that waits
    for it (a keeper takes ~10 ms to make; sixteen made in a row were 160-190 ms)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # What bwrap or the zygote say before dying ("Creating new namespace failed:
        # Operation not permitted") goes into the error a caller sees, not a log apart.
        import tempfile  # noqa: PLC0415 - the worker's side only: the zygote stays lean

        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives with the zygote
        try:
            self.proc = subprocess.Popen(
                [*argv, str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=dict(env),
                stdin=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True,
                close_fds=True,
            )
        except OSError:
            ours.close()
            self._stderr.close()
            raise
        finally:
            theirs.close()
        self.chan = ours
        self._lock = threading.Lock()
        """Guards the waiters, the next id, `_lost`, and each send."""
        self._waiting: dict[int, _Waiter] = {}
        self._next_id = 0
        self._lost = False
        self._reader = threading.Thread(target=self._read_answers, daemon=True,
                                        name="bashfleet-zygote-answers")
        self._reader.start()

    def alive(self) -> bool:
        """False once the zygote (or its bwrap) exited."""
        return self.proc.poll() is None

    def keeper(self, spec: Mapping[str, Any], fds: Sequence[int], timeout: float,
               setup_s: float | None = None) -> int:
        """A new keeper, its view built: its host pid. `fds`: its listening socket, then
        the cgroup procs files it joins. `setup_s`: the zygote's deadline for its report
        (KEEPER_SETUP_S when None), which `timeout` should outlast."""
        try:
            _, body, _ = self._ask(b"N", {"spec": dict(spec), "setup_s": setup_s}, fds,
                                   timeout)
        except OSError as exc:
            said = self.last_words()
            if isinstance(exc, SandboxError) and not said:
                raise
            what = (exc.strerror or str(exc)) if isinstance(exc, KeeperLostError) else \
                f"the sandbox zygote went away: {exc}"
            raise KeeperLostError(errno.EPIPE, what + (f" ({said})" if said else "")) from exc
        return int(body["pid"])

    def wake(self, holder: int, link: int, given: Sequence[int], cgroup_fds: Sequence[int],
             timeout: float) -> int:
        """A service forked into the sleeping workspace whose holder's pidfd is `holder`:
        its host pid. `link`: the connection the holder answered `Z` on; `given`: what
        came with the `Z`."""
        try:
            # What came with the `Z`: listener, spec[, user namespace[, spawner]].
            _, body, _ = self._ask(b"W", {"userns": len(given) > 2, "spawner": len(given) > 3},
                                   [holder, link, *given, *cgroup_fds], timeout)
        except KeeperLostError as exc:
            said = self.last_words()
            raise KeeperLostError(errno.EPIPE, (exc.strerror or str(exc))
                                  + (f" ({said})" if said else "")) from exc
        return int(body["pid"])

    def _ask(self, tag: bytes, body: Mapping[str, Any], fds: Sequence[int],
             timeout: float) -> tuple[bytes, dict[str, Any], list[int]]:
        """Send one request and wait for its own answer (`R`); SandboxError for `E` or
        silence, KeeperLostError when the zygote goes away meanwhile."""
        waiter = _Waiter()
        with self._lock:
            if self._lost:
                raise KeeperLostError(errno.EPIPE, "the sandbox zygote went away")
            self._next_id += 1
            rid = self._next_id
            self._waiting[rid] = waiter
            try:
                proto.send(self.chan, tag, {**body, "id": rid}, fds)
            except OSError as exc:
                del self._waiting[rid]
                raise KeeperLostError(errno.EPIPE,
                                      f"the sandbox zygote went away: {exc}") from None
        if not waiter.done.wait(timeout):
            with self._lock:
                gone = self._waiting.pop(rid, None)
            if gone is not None:
                raise SandboxError(errno.ETIMEDOUT, "no answer from the sandbox zygote")
            waiter.done.wait()  # the answer came as the wait ended: it is being handed over
        return judge(*waiter.answer, b"R", "sandbox zygote")

    def _read_answers(self) -> None:
        """The reader thread: each answer to the request with its id, until the channel
        ends; then every request still waiting gets the end (KeeperLostError)."""
        while True:
            try:
                tag, body, fds = proto.recv(self.chan)
            except OSError:
                tag, body, fds = b"", {}, []
            if tag == b"":
                break
            with self._lock:
                waiter = self._waiting.pop(body.get("id", -1), None)
            if waiter is None:
                _drop_late(tag, body, fds)
                continue
            waiter.answer = (tag, body, fds)
            waiter.done.set()
        with self._lock:
            self._lost = True
            waiting, self._waiting = list(self._waiting.values()), {}
        for waiter in waiting:
            waiter.done.set()

    def last_words(self) -> str:
        """The last line the zygote (or bwrap) wrote on stderr, once it exited."""
        if self.proc.poll() is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 2000))
        lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1].strip() if lines else ""

    def close(self, timeout: float = 5.0) -> None:
        """Close the channel: the zygote exits (keepers live on); requests still waiting
        get KeeperLostError."""
        # shutdown, not close alone, wakes the reader thread blocked in recvmsg.
        with contextlib.suppress(OSError):
            self.chan.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout)
        self.chan.close()
        self._stderr.close()


def _drop_late(tag: bytes, body: Mapping[str, Any], fds: Sequence[int]) -> None:
    """An answer nobody waits for (its request timed out): a keeper made that late would
    watch its worker with no workspace to serve, so it is killed."""
    proto.close_all(fds)
    if tag == b"R" and isinstance(body.get("pid"), int):
        with contextlib.suppress(OSError):
            os.kill(body["pid"], signal.SIGKILL)


@dataclass(frozen=True)
class Started:
    """A call as its keeper started it."""

    pid: int
    """Its pid in the workspace (what the calls of the workspace see)."""
    host_pid: int
    start_ticks: int | None
    """Its start time (clock ticks after boot, host's /proc)."""


#: Seconds the keeper gets to say whether a throwaway call left its workspace clean
#: (past its own deadline for the call's processes to go, `keeper.RECYCLE_TIMEOUT_S`).
CLEAN_ANSWER_S = 10.0


class KeeperConnection:
    """One connection to a workspace's keeper: one call (or job start) at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reusable = True
        self.capped = False
        """The last call was stopped for passing its output cap."""
        self.clean: bool | None = None
        """A recycled call's workspace is clean (None: not asked, or not read yet)."""
        self.clean_pending = False
        """The keeper's word on that (`K`) follows its call's status, unread yet
        (`read_clean`)."""
        self._status: dict[str, Any] | None = None
        """The call's status, read already (by `adopt`, which the call's end beat)."""

    @classmethod
    def connect(cls, path: str, timeout: float = 5.0) -> KeeperConnection:
        """Connect to the keeper listening at `path` (long paths through /proc/self/fd)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            _by_path(path, sock.connect)
        except OSError as exc:
            sock.close()
            raise KeeperLostError(exc.errno or errno.ECONNREFUSED,
                                  f"the workspace's keeper is not there: {exc}") from exc
        sock.settimeout(None)
        return cls(sock)

    def _send(self, tag: bytes, body: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
        try:
            proto.send(self.sock, tag, body, fds)
        except OSError as exc:
            self.reusable = False
            raise KeeperLostError(errno.EPIPE, f"the workspace's keeper went away: {exc}") from exc

    def ping(self, timeout: float = 5.0, *, hold: bool = False) -> int:
        """The keeper's pid in its namespace (1, or another for a service that may
        sleep) once it answers; KeeperAsleepError when its workspace sleeps. `hold`: it
        does not sleep while this connection is open."""
        self._send(b"?", {"hold": True} if hold else {})
        _, body, _ = self._expect(b"!", timeout)
        return int(body["pid"])

    def _expect(self, tags: bytes, timeout: float | None) -> tuple[bytes, dict[str, Any],
                                                                     list[int]]:
        try:
            return expect(self.sock, tags, timeout, "workspace's keeper")
        except KeeperLostError:
            self.reusable = False
            raise

    def start(self, request: proto.SpawnRequest, fds: Sequence[int],
              timeout: float = 10.0) -> Started:
        """Start a call (or a job: `request["job"]`); SandboxError when it could not."""
        self._send(b"C", request, fds)
        try:
            _, body, _ = self._expect(b"P", timeout)
        except SandboxError as exc:
            if exc.errno == errno.ETIMEDOUT:
                self.reusable = False
            raise
        ticks = body.get("start_ticks")
        return Started(int(body["pid"]), int(body["host_pid"]),
                       int(ticks) if ticks is not None else None)

    def wait_status(self, timeout: float | None) -> int:
        """The raw wait status of the call's bash; TimeoutError while it runs. A keeper
        that died (its workspace deleted) reports SIGKILL."""
        fds: list[int] = []
        if self._status is not None:
            tag, body, self._status = b"S", self._status, None
        else:
            self.sock.settimeout(timeout)
            try:
                tag, body, fds = proto.recv(self.sock)
            except TimeoutError:
                raise
            except OSError:
                tag, body, fds = b"", {}, []
            finally:
                with contextlib.suppress(OSError):
                    self.sock.settimeout(None)
        proto.close_all(fds)
        if tag != b"S":
            self.reusable = False
            return signal.SIGKILL
        self.capped = bool(body.get("capped"))
        self.clean = None
        self.clean_pending = bool(body.get("clean_follows"))
        return int(body["status"])

    def read_clean(self, timeout: float = CLEAN_ANSWER_S) -> bool:
        """Whether the throwaway call that ended left its workspace clean: the keeper's
        `K`, which follows the call's status once it looked (False when it does not say:
        the workspace is then not used again)."""
        if not self.clean_pending:
            return bool(self.clean)
        self.clean_pending = False
        try:
            _, body, _ = self._expect(b"K", timeout)
        except SandboxError:
            self.reusable = False
            return False
        self.clean = bool(body.get("clean"))
        return self.clean

    def adopt(self, body: proto.AdoptRequest, fds: Sequence[int], timeout: float = 10.0) -> bool:
        """Make the running call a job whose end the keeper records; False when it ended
        first (its status is then `wait_status`'s, read here already when it came
        first)."""
        self._send(b"A", body, fds)
        try:
            tag, answer, _ = self._expect(b"aS", timeout)
        except KeeperLostError:
            raise
        except SandboxError:
            return False
        if tag == b"S":
            # It ended as it was asked: its status was sent first, kept here for
            # `wait_status`. The keeper's refusal (`E`) follows, after its `K` for a
            # throwaway's call: the connection serves nothing else.
            self._status = answer
            self.reusable = False
            return False
        return True

    def claim(self, body: Mapping[str, Any], fds: Sequence[int] = (),
              timeout: float = KEEPER_SETUP_S) -> None:
        """A blank keeper builds the view `body` gives (its first message); `fds`: the
        locked slot of its host ids, which it holds for its life
        (`bashfleet.worker.engine.id_slots`). The view is the rest of a keeper's setup,
        and has its deadline: a host running a thousand calls at once, each claiming a
        keeper, took more than 10 s for one (the call was refused)."""
        self._send(b"V", body, fds)
        self._expect(b"v", timeout)

    def exit_when_idle(self, timeout: float = 5.0) -> None:
        """The keeper exits once nothing runs in it (ending its workspace's namespaces)."""
        self._send(b"X", {})
        self._expect(b"x", timeout)

    def recycle(self, timeout: float = 5.0) -> bool:
        """Kill every process of the workspace; True when nothing of its calls is left in
        its namespaces (it may serve another throwaway call)."""
        self._send(b"R", {})
        _, body, _ = self._expect(b"r", timeout)
        return bool(body.get("clean"))

    def fileno(self) -> int:
        """Readable when the call's status arrives (or the keeper is gone)."""
        return self.sock.fileno()

    def close(self) -> None:
        """Let it go (the keeper drops the connection; a call on it runs on)."""
        self.reusable = False
        self.sock.close()


class KeeperProcess:
    """A call run by a keeper, with the part of Popen's interface the engine uses.
    `pid` is its host pid (and process group): the worker watches and kills by it."""

    def __init__(self, conn: KeeperConnection, started: Started) -> None:
        self.conn = conn
        self.started = started
        self.pid = started.host_pid
        self.ns_pid = started.pid
        self.returncode: int | None = None
        self.capped = False
        """The keeper stopped the call for passing its output cap."""

    def wait(self, timeout: float | None = None) -> int:
        """The returncode once the call ended; subprocess.TimeoutExpired before."""
        if self.returncode is None:
            try:
                status = self.conn.wait_status(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(["bash"], timeout or 0.0) from None
            self.returncode = proto.returncode(status)
            self.capped = self.conn.capped
            self.ended()
        return self.returncode

    def poll(self) -> int | None:
        """The returncode if the call ended, else None."""
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def exit_fd(self) -> int:
        """An fd that polls readable when the call has ended."""
        return self.conn.fileno()

    def ended(self) -> None:
        """Called once the status is known; a pool takes the connection back here."""
        self.conn.close()


def _by_path(path: str, use: Any) -> None:
    """`use(path)` (a socket's connect or bind), through /proc/self/fd when the path is
    longer than a socket address holds (sun_path is 108 bytes)."""
    if len(os.fsencode(path)) <= 100:
        use(path)
        return
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_CLOEXEC)
    try:
        use(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    finally:
        os.close(folder)


def listen(path: str) -> socket.socket:
    """A keeper's listening socket at `path`, mode 0600 (made by the worker, handed to
    the keeper: the path is in the state directory, which the keeper cannot see)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    # chmod after bind, never the umask: it is the whole process's, and a worker is
    # threaded (a zygote started meanwhile would inherit it). The directory is 0700.
    _by_path(path, sock.bind)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


if __name__ == "__main__":  # pragma: no cover - run by bwrap
    sys.exit(zygote_main(int(sys.argv[1])))
