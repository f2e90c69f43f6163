"""A workspace's keeper: pid 1 of the workspace's PID namespace (a leased workspace's:
beside its holder, which is pid 1), in its mount view.

Standard library only: the zygote (`bashfleet.worker.engine.isolate.launcher`) forks it, under
`python -I -S`.

    worker consumer ─┐                     keeper (pid 1)   ── posix_spawn ──► bash -c CMD
    job supervisor  ─┼── unix socket ──►   in the workspace's
    (another) worker ┘   (its path: the    PID, mount, IPC, network namespaces (the
                          host's state dir)    host's network under policy `host`)

Every call and background job of a workspace is a child of its keeper, so they all share
one PID namespace: a call sees and signals the processes the previous ones left running
(`kill -9 -PGID` with the numbers a dialect showed works), and nothing outside the
workspace is visible. A call ends when its bash ends: what it left running (`cmd &`,
`nohup`, `setsid`) lives on in the workspace, reparented to the keeper, which reaps it,
until a kill, the workspace's end or a timeout of the call it came from. The keeper
outlives the worker that made it (so do the jobs in it); a worker that restarts reaches
it again through its socket. Killing the keeper (SIGKILL from the host) ends everything
in the workspace: that is how a workspace is deleted.

The socket answers only the worker: a peer must be outside the workspace's PID
namespace (SO_PEERCRED gives pid 0 then) and have the worker's uid. Calls run as another
user when the worker is root; when it is not, they cannot reach the socket's path (the
state directory is hidden from every workspace).

Messages (`bashfleet.worker.engine.isolate.proto`), per connection, one call at a time:

    C {argv, executable, cwd, env, targets, ctty, output_cap, kill_grace_s, job}
      + fds (the call's targets, then the job's status directory)  ->  P {pid, host_pid,
      start_ticks} or E {errno, message, filename}; then S {status, capped} when its bash
      ends (not for a job: the keeper records a job's end itself)
    A {status, cap_mb, timeout_s, kill_grace_s} + the status directory: the running
      call of this connection becomes a job (its end recorded by the keeper)  ->  a, or
      E when it ended already (its S was sent)
    X {}  exit once no call or job runs, no longer bound to the worker that made it (a
      throwaway workspace whose job outlives its
      call)  ->  x
    R {}  recycle (a throwaway workspace whose call left no job): kill every process of
      the workspace, then say whether it is clean (no process, nothing in /dev/shm, no
      System V IPC object)  ->  r {clean}
    ? {hold}  ->  ! {pid}  (ready, alive; `hold`: it does not sleep while this
      connection is open)
    V {plan, uid, gid, groups}  (a blank keeper's first message: `main`)  ->  v

A leased workspace's keeper sleeps (`keeper_idle_s`; see "sleep and wake" below): pid 1
is then its holder (`holder.c`), which answers a worker's connection, whatever was sent
on it, with `Z` {} + [listener, the keeper's spec, its user namespace] and reads nothing
else; the worker's zygote wakes a keeper from them (`launcher`, `W`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import platform
import select
import selectors
import signal
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any, cast

from bashfleet.worker.engine.isolate import (
    HOLDER_NAME,
    job_end,
    kernel,
    proto,
    syscall_filter,
    view,
)


@dataclasses.dataclass
class Job:
    """A process whose end the keeper records (a background job)."""

    status: str
    """Its status file's name in `dir_fd`."""
    dir_fd: int
    cap_mb: int | None
    deadline: float | None
    """Monotonic time past which it is stopped (its background timeout); None: never."""


@dataclasses.dataclass
class Tracked:
    """The bash of one call or job, until the keeper reaps it."""

    pid: int
    conn: Conn | None
    """Who hears its status (None: a job, or a call whose worker went away)."""
    outputs: list[int]
    """Its stdout/stderr files (the cap is watched on them; a job's end appended)."""
    grace_s: float
    watch: proto.CapWatch | None = None
    next_look: float = 0.0
    job: Job | None = None
    kill_at: float | None = None
    """Set once it is being stopped: SIGKILL to its group at that time."""
    capped: bool = False
    recycle: bool = False
    """A throwaway workspace's call: when it ends, everything left in the workspace is
    killed and its status says whether the workspace is clean for another call."""

    def close(self) -> None:
        proto.close_all(self.outputs)
        self.outputs = []
        if self.job is not None:
            proto.close_all([self.job.dir_fd])


@dataclasses.dataclass
class Lease:
    """A workspace's lease, as its keeper holds it: its record (a file in a directory of
    the host's state open as `dir_fd`, its mtime the last use) and its TTL. Past the TTL
    and a grace (the host's reaper ends it sooner, with its files), or once its record is
    gone, the keeper exits, so a workspace ends at its lease even if no worker of its host
    ever comes back."""

    dir_fd: int
    name: str
    ttl_s: float
    look_s: float
    """How often it looks."""
    grace_s: float
    """How long past its TTL it waits for the host's reaper (which removes the workspace's
    files too) before it ends the workspace itself."""
    next_look: float = 0.0

    def over(self, now: float) -> bool:
        if now < self.next_look:
            return False
        self.next_look = now + self.look_s
        try:
            used = os.stat(self.name, dir_fd=self.dir_fd).st_mtime
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return time.time() - used > self.ttl_s + self.grace_s


@dataclasses.dataclass(eq=False)
class Conn:
    """One connection from the worker (or a job supervisor)."""

    sock: socket.socket
    busy: Tracked | None = None
    hold: bool = False
    """Keeps the keeper awake while open (`?` {hold}: a connection a worker hands to a
    job's supervisor, which has no zygote to wake it)."""


class Keeper:
    """The keeper's loop: connections, spawns, reaping, caps and timeouts."""

    def __init__(self, listener: socket.socket, *, worker_uid: int,
                 who: kernel.Identity | None, host_proc: int) -> None:
        self.listener = listener
        self.worker_uid = worker_uid
        self.who = who
        self.host_proc = host_proc
        self.lease: Lease | None = None
        self.maker = -1
        self.sel = selectors.DefaultSelector()
        self.tracked: dict[int, Tracked] = {}
        self.exit_when_idle = False
        self.open_files: int | None = None
        """RLIMIT_NOFILE of every process it starts (the workspace's `open_files`)."""
        self.seccomp: kernel.SyscallFilter | None = None
        """The system call filter every process it starts runs under (None: none)."""
        self.spawner = -1
        """The spawner binary (spawn.c), opened before the view: its calls are started
        by a vfork of it, not a fork of this process (-1: forked)."""
        self.filter_fd = -1
        self.ready: kernel.ReadySpawn | None = None
        """The spawner started for a throwaway workspace's next call, once its last
        call's processes ended (`make_ready`): its steps that do not depend on the
        call, the filter's among them, are taken before the call comes."""
        self.ready_misses = 0
        """Ready spawners in a row that could not take their call: past READY_MISSES
        none is started any more (one that fails its own steps would every time)."""
        self.idle_s = 0.0
        """Seconds with nothing to do after which it exits, its holder keeping the
        workspace (0: never; a keeper that is pid 1 never sleeps)."""
        self.last_active = time.monotonic()
        self.conns: set[Conn] = set()
        self.link: socket.socket | None = None
        """A service's end of its link to the holder, held while it lives."""
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake = wake_read
        signal.signal(signal.SIGCHLD, _noop)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        self.sel.register(wake_read, selectors.EVENT_READ, "wake")

    # ------------------------------------------------------------------------ the loop

    def serve(self) -> int:
        """Serve until asked to exit once idle, or past its lease (a keeper is otherwise
        killed)."""
        while True:
            for key, _ in self.sel.select(self._pause()):
                self._event(key)
            self._reap()
            self._tick()
            if self.exit_when_idle and not self.tracked:
                return 0
            if self.lease is not None and self.lease.over(time.monotonic()):
                return 0  # pid 1 exits: the kernel ends every process of the workspace
            if self.idle_s and self._sleepy(time.monotonic()):
                return 0  # the holder keeps the workspace; a worker wakes a keeper again

    def _sleepy(self, now: float) -> bool:
        """Nothing ran or was asked for `idle_s` seconds, and nothing waits to be read:
        what arrives after this look is never read (so never run), and the worker that
        sent it sees its connection close and asks again."""
        if self.tracked or any(conn.hold for conn in self.conns):
            self.last_active = now
        if not should_sleep(self.idle_s, now, self.last_active):
            return False
        return not _any_readable([self.listener.fileno(),
                                  *(conn.sock.fileno() for conn in self.conns)])

    def _pause(self) -> float | None:
        times = [t for tracked in self.tracked.values() for t in _due(tracked)]
        if self.lease is not None:
            times.append(self.lease.next_look)
        if self.idle_s:
            times.append(self.last_active + self.idle_s)
        return None if not times else max(0.0, min(times) - time.monotonic())

    def _event(self, key: selectors.SelectorKey) -> None:
        if key.data == "listen":
            self._accept()
        elif key.data == "maker":
            # Bound to the worker process that made it (the probe's keeper, a blank or a
            # throwaway workspace), which is gone: none will use it again.
            os._exit(0)
        elif key.data == "wake":
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake, 512):
                    pass
        else:
            self._message(key.data)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if pid != 0 or uid != self.worker_uid:
            sock.close()  # a process of the workspace, or another user: never served
            return
        sock.setblocking(True)
        # A worker connected: its first message gets `idle_s` to come.
        self.last_active = time.monotonic()
        self.add_conn(Conn(sock))

    def add_conn(self, conn: Conn) -> None:
        self.conns.add(conn)
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _message(self, conn: Conn) -> None:
        self.last_active = time.monotonic()
        try:
            tag, body, fds = proto.recv(conn.sock)
        except OSError:
            tag, body, fds = b"", {}, []
        if tag == b"":
            self._drop(conn)
            return
        try:
            self._answer(conn, tag, body, fds)
        except OSError:
            proto.close_all(fds)
            self._drop(conn)

    def _answer(self, conn: Conn, tag: bytes, body: dict[str, Any], fds: list[int]) -> None:
        # The body's fields are the request's (`proto`'s messages): the worker built it.
        if tag == b"C":
            self._spawn(conn, cast(proto.SpawnRequest, body), fds)
        elif tag == b"A":
            self._adopt(conn, cast(proto.AdoptRequest, body), fds)
        elif tag == b"X":
            self.exit_when_idle = True
            self.unbind_maker()  # its job outlives the worker, as every job does
            proto.send(conn.sock, b"x", {})
        elif tag == b"?":
            conn.hold = conn.hold or bool(body.get("hold"))
            proto.send(conn.sock, b"!", proto.PingAnswer(pid=os.getpid()))
        elif tag == b"R":
            clean = self._recycle()
            proto.send(conn.sock, b"r", proto.RecycleAnswer(clean=clean))
            if clean:
                self.make_ready()
        else:
            proto.close_all(fds)
            proto.send(conn.sock, b"E", proto.ErrorAnswer(errno=errno.EPROTO,
                                                          message=f"unknown {tag!r}"))

    def bind_maker(self, maker: int) -> None:
        """Exit when the worker process whose pidfd `maker` is ends."""
        self.maker = maker
        self.sel.register(maker, selectors.EVENT_READ, "maker")

    def unbind_maker(self) -> None:
        if self.maker >= 0:
            self.sel.unregister(self.maker)
            os.close(self.maker)
            self.maker = -1

    def _drop(self, conn: Conn) -> None:
        """A connection closed: a call it ran goes on (the worker that restarts, or its
        recovery, deals with it); it just has nobody to tell its end."""
        if conn.busy is not None:
            conn.busy.conn = None
        self.conns.discard(conn)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()

    # ------------------------------------------------------------------------- spawning

    def _spawn(self, conn: Conn, body: proto.SpawnRequest, fds: list[int]) -> None:
        targets = body["targets"]
        stdio, extra = fds[: len(targets)], fds[len(targets):]
        outputs = [os.dup(fd) for fd, target in zip(stdio, targets, strict=True)
                   if target in (1, 2)]
        try:
            pid = self._start(body, stdio, targets)
        except OSError as exc:
            proto.close_all(outputs + extra)
            proto.send(conn.sock, b"E", proto.error_body(exc))
            return
        finally:
            proto.close_all(stdio)
        tracked = Tracked(pid, conn, outputs, float(body.get("kill_grace_s") or 0),
                          recycle=bool(body.get("recycle")))
        cap = body.get("output_cap")
        if cap is not None and outputs:
            tracked.watch = proto.CapWatch(lambda: proto.files_size(tracked.outputs), int(cap))
            # Its first look once it had time to write, as a job supervisor's: a look at
            # once finds nothing and waits the longest (most calls end before).
            tracked.next_look = time.monotonic() + proto.CAP_MIN_WAIT_S
        job = body.get("job")
        if job is not None and extra:
            tracked.job = _job(job, extra[0])
            tracked.conn = None
        else:
            conn.busy = tracked
        self.tracked[pid] = tracked
        host = kernel.host_pid(pid, self.host_proc)
        proto.send(conn.sock, b"P", proto.SpawnAnswer(
            pid=pid, host_pid=host, start_ticks=kernel.start_ticks(host, self.host_proc)))

    def _start(self, body: proto.SpawnRequest, stdio: Sequence[int],
               targets: Sequence[int]) -> int:
        # The child enters the cwd and finds bash as the workspace's user, in its view:
        # the keeper (root) never resolves a path a command may have planted.
        env = body["env"]
        if "\0" in "".join((body["cwd"], body.get("executable") or "", *body["argv"], *env,
                             *env.values())):
            # The worker's models refuse one; exec could not take it either way.
            raise OSError(errno.EINVAL, "a NUL byte in the call's cwd, command or environment")
        if self.ready is not None:
            ready, self.ready = self.ready, None
            pid = kernel.start_ready(
                ready, body.get("executable"), body["argv"], body["env"], stdio, targets,
                cwd=body["cwd"], ctty=bool(body.get("ctty")), open_files=self.open_files,
                file_size=body.get("file_size"))
            if pid is not None:
                self.ready_misses = 0
                return pid
            kernel.end_ready(ready)
            self.ready_misses += 1
        if self.spawner >= 0 and self.who is not None:
            try:
                pid = kernel.spawn_through(
                    self.spawner, body.get("executable"), body["argv"], body["env"], stdio,
                    targets, cwd=body["cwd"], who=self.who, ctty=bool(body.get("ctty")),
                    open_files=self.open_files, file_size=body.get("file_size"),
                    filter_fd=self._filter_fd())
            except kernel.SpawnerUnavailableError:
                os.close(self.spawner)  # this keeper forks its calls from now on
                self.spawner = -1
                pid = None
            if pid is not None:
                return pid
        return kernel.spawn(body.get("executable"), body["argv"], body["env"], stdio, targets,
                            cwd=body["cwd"], who=self.who, ctty=bool(body.get("ctty")),
                            open_files=self.open_files, file_size=body.get("file_size"),
                            seccomp=self.seccomp)

    def make_ready(self) -> None:
        """Start the next call's spawner now (a throwaway workspace, clean after its last
        call): what bash waits for at a call is then only the call's own steps."""
        if (self.ready is not None or self.spawner < 0 or self.who is None
                or self.ready_misses >= READY_MISSES):
            return
        try:
            self.ready = kernel.ready_spawn(self.spawner, self.who, self._filter_fd())
        except OSError:
            self.ready = None  # the next call starts its spawner itself

    def _drop_ready(self) -> None:
        """The ready spawner is gone, or about to be (`kill(-1)`): forget it."""
        if self.ready is not None:
            self.ready.close()
            self.ready = None

    def _filter_fd(self) -> int:
        """The calls' seccomp program in a sealed memfd, for the spawner (-1: none)."""
        if self.seccomp is not None and self.filter_fd < 0:
            self.filter_fd = _sealed(self.seccomp.code.raw, "bashfleet-seccomp")
        return self.filter_fd

    def _adopt(self, conn: Conn, body: proto.AdoptRequest, fds: list[int]) -> None:
        tracked = conn.busy
        if tracked is None or not fds:
            proto.close_all(fds)
            proto.send(conn.sock, b"E", proto.ErrorAnswer(errno=errno.ESRCH,
                                                          message="it ended already"))
            return
        tracked.job = _job(body, fds[0])
        tracked.grace_s = float(body.get("kill_grace_s") or tracked.grace_s)
        tracked.recycle = False  # a job now: the workspace lives on with it
        tracked.conn = None
        conn.busy = None
        proto.send(conn.sock, b"a", {})

    def _recycle(self) -> bool:
        """Kill every process of the workspace and reap them (`_end_all`); True when
        nothing of the last call is left in the namespaces (`_left_nothing`)."""
        return self._end_all() and _left_nothing()

    def _end_all(self) -> bool:
        """Kill every process of the workspace (kill(-1) from pid 1 reaches them all, a
        fork racing it fails: its parent has SIGKILL pending) and reap them; False when
        one is tracked (a job runs) or they would not go."""
        if self.tracked:
            return False
        self._drop_ready()
        deadline = time.monotonic() + RECYCLE_TIMEOUT_S
        delay = 0.0005
        while True:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

    # -------------------------------------------------------------------- ends and caps

    def _reap(self) -> None:
        """Reap every child that ended (orphans of the workspace come to pid 1 too)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.ready is not None and pid == self.ready.pid:
                self._drop_ready()
            tracked = self.tracked.pop(pid, None)
            if tracked is not None:
                self._ended(tracked, status)

    def _ended(self, tracked: Tracked, status: int) -> None:
        try:
            if tracked.job is not None:
                code = proto.returncode(status)
                if tracked.outputs:
                    job_end.append_end(tracked.outputs[0], code, tracked.capped,
                                       tracked.job.cap_mb)
                note = job_end.cap_note(tracked.job.cap_mb) if tracked.capped else None
                with contextlib.suppress(OSError):
                    job_end.write_status(tracked.job.status, code, note,
                                         dir_fd=tracked.job.dir_fd)
            elif tracked.conn is not None:
                tracked.conn.busy = None
                answer = proto.EndAnswer(status=status, capped=tracked.capped)
                # A throwaway workspace's call: nothing it started outlives it. Its
                # processes end before its status goes (its output is whole then); what
                # only the next call needs looked at, after (`K`), while the worker
                # builds this call's result.
                if tracked.recycle:
                    ended = self._end_all()
                    answer["clean_follows"] = True
                with contextlib.suppress(OSError):
                    proto.send(tracked.conn.sock, b"S", answer)
                if tracked.recycle:
                    clean = proto.CleanAnswer(clean=ended and _left_nothing())
                    with contextlib.suppress(OSError):
                        proto.send(tracked.conn.sock, b"K", clean)
                    if clean["clean"]:
                        self.make_ready()
        finally:
            tracked.close()

    def _tick(self) -> None:
        now = time.monotonic()
        for tracked in list(self.tracked.values()):
            if tracked.kill_at is not None:
                if now >= tracked.kill_at:
                    _signal_group(tracked.pid, signal.SIGKILL)
                    tracked.kill_at = None
                continue
            if tracked.job is not None and tracked.job.deadline is not None \
                    and now >= tracked.job.deadline:
                self._stop(tracked, now)
            elif tracked.watch is not None and now >= tracked.next_look:
                over, pause = tracked.watch.step()
                tracked.next_look = now + pause
                if over:
                    tracked.capped = True
                    self._stop(tracked, now)

    @staticmethod
    def _stop(tracked: Tracked, now: float) -> None:
        """SIGTERM to its group now, SIGKILL after its grace period."""
        _signal_group(tracked.pid, signal.SIGTERM)
        tracked.watch = None
        tracked.kill_at = now + tracked.grace_s


#: Seconds a recycle waits for the last processes to die of SIGKILL (one stuck in the
#: kernel, on a dead NFS server say): past it the workspace is deleted instead.
RECYCLE_TIMEOUT_S = 2.0
#: Ready spawners in a row not able to take their call after which a keeper starts
#: its calls' spawners as the calls come.
READY_MISSES = 3



def _first_ready(fds: list[int]) -> int:
    """The first of `fds` with something to read (or closed), waiting as long as it takes
    (poll(2): no limit on the descriptors' numbers)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    ready = {fd for fd, _ in poller.poll()}
    return next(fd for fd in fds if fd in ready)

def _left_nothing() -> bool:
    """Once every process of the workspace ended: nothing of its last call is left in
    its namespaces for the next one (maybe another owner's), which gets a session
    keyring of its own, as a new workspace does."""
    _own_session_keyring()
    return _empty_dir("/dev/shm") and _no_ipc_objects()


def _empty_dir(path: str) -> bool:
    try:
        return not os.listdir(path)
    except OSError:
        return True


def _no_ipc_objects() -> bool:
    """No System V shared memory, semaphore or message queue in our IPC namespace."""
    for name in ("shm", "sem", "msg"):
        try:
            fd = os.open(f"/proc/sysvipc/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            # Plain reads: a file object costs three system calls more, after every call.
            chunks = [os.read(fd, 65536)]
            while chunks[-1]:
                chunks.append(os.read(fd, 65536))
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(b"".join(chunks).splitlines()) > 1:  # a header line, then one per object
            return False
    return True


def _due(tracked: Tracked) -> list[float]:
    times = []
    if tracked.kill_at is not None:
        times.append(tracked.kill_at)
    elif tracked.watch is not None:
        times.append(tracked.next_look)
    if tracked.job is not None and tracked.job.deadline is not None:
        times.append(tracked.job.deadline)
    return times


def _job(body: proto.JobTerms, dir_fd: int) -> Job:
    timeout = body.get("timeout_s")
    return Job(status=str(body["status"]), dir_fd=dir_fd, cap_mb=body.get("cap_mb"),
               deadline=None if timeout is None else time.monotonic() + float(timeout))


def _signal_group(pgid: int, signum: int) -> None:
    # ESRCH is success: the group is gone already.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _noop(signum: int, frame: object) -> None:
    del signum, frame


# ----------------------------------------------------------------------------- setup


def main(spec: dict[str, Any], listener_fd: int, report_fd: int) -> int:
    """The keeper's process, forked by the zygote's helper into the new namespaces:
    build the view, drop what calls must not have, report ready (or why not), serve.

    A spec without a plan makes a *blank* keeper: it reports ready at once and builds its
    view when the worker claims it for a workspace (`V` {plan, uid, gid, groups} as the
    first message, answered `v`): the fork, the namespaces and the cgroup join (a cgroup
    v1 migration waits out an RCU grace period, ~15 ms here) are made ahead. Until then it
    watches the worker process that made it (`maker_fd`, a pidfd) and exits when that one
    dies, since no other will claim it; the sandbox's probe keeper watches it for good."""
    who = None
    try:
        host_proc = _enter(spec)
        seccomp = _syscall_filter(spec)
        if spec.get("plan") is not None:
            spec = {**spec, **_binary_fds(spec)}
            who = _setup_view(spec)
        else:
            _prepare(spec)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.write(report_fd, proto.report_line("error", f"{exc.errno or errno.EIO} {exc}"))
        return 1
    os.write(report_fd, proto.report_line("ready"))
    os.close(report_fd)
    listener = socket.socket(fileno=listener_fd)
    first = None
    if spec.get("plan") is None:
        first, spec, who = _claimed(listener, spec)
    listener.setblocking(False)
    keeper = Keeper(listener, worker_uid=int(spec["worker_uid"]), who=who, host_proc=host_proc)
    keeper.seccomp = seccomp
    keeper.spawner = int(spec.get("spawner_fd", -1))
    if spec.get("open_files") is not None:
        keeper.open_files = int(spec["open_files"])
    if first is not None:
        keeper.add_conn(Conn(first))
    if int(spec.get("maker_fd", -1)) >= 0:
        keeper.bind_maker(int(spec["maker_fd"]))
    if spec.get("lease_fd") is not None:
        lease = spec["lease"]
        keeper.lease = Lease(int(spec["lease_fd"]), str(lease["name"]), float(lease["ttl_s"]),
                             look_s=float(lease["look_s"]), grace_s=float(lease["grace_s"]))
        keeper.lease.next_look = time.monotonic() + keeper.lease.look_s
    idle_s = float(spec.get("idle_s") or 0)
    if spec.get("holder_fd") is not None and keeper.lease is not None and keeper.maker < 0 \
            and idle_s > 0:
        _split(keeper, spec, idle_s)  # returns in the service (or when the exec failed)
    if spec.get("bound_to_maker"):
        keeper.make_ready()  # a throwaway made ahead: its first call's spawner too
    return keeper.serve()


# ------------------------------------------------------------------ sleep and wake
#
#     keeper (pid 1) ── fork ──► service: this module's Keeper, not pid 1, exits once
#        │ exec by fd                idle (`idle_s`): its pages are what a sleeping
#        ▼                           workspace gives back
#     holder (pid 1, holder.c): reaps, ends the workspace with its lease, and answers a
#        worker that connects while no service runs `Z` + [listener, spec, userns]; the
#        worker's zygote then setns()es a fork of itself into the holder's namespaces
#        (`launcher`, `W`): a service again (`wake`).


def should_sleep(idle_s: float, now: float, last_active: float) -> bool:
    """Whether a service with nothing running has been idle long enough to exit."""
    return idle_s > 0 and now - last_active >= idle_s


def service_spec(spec: dict[str, Any], who: kernel.Identity | None,
                 idle_s: float) -> dict[str, Any]:
    """What a woken service needs to serve as this one does (the holder keeps it in a
    sealed memfd; the workspace's user namespace travels beside it as a descriptor)."""
    run_user = spec.get("ids") is None and spec.get("uid") is not None
    return {
        "worker_uid": int(spec["worker_uid"]),
        "who": None if who is None else [who.uid, who.gid, list(who.groups)],
        "userns": who is not None and who.userns_fd >= 0,
        "run_user": run_user,
        "open_files": spec.get("open_files"),
        "seccomp": spec.get("seccomp"),
        "network": spec.get("network", True),
        "idle_s": idle_s,
    }


def holder_argv(listener: int, worker_uid: int, *, spec_fd: int, userns_fd: int,
                lease: Lease | None, ready_fd: int, service_fd: int,
                spawner_fd: int = -1) -> list[str]:
    """The holder's command line (holder.c's usage)."""
    if lease is None:
        lease_args = ["-1", "-", "0", "0", "0"]
    else:
        lease_args = [str(lease.dir_fd), lease.name, repr(lease.ttl_s), repr(lease.look_s),
                      repr(lease.grace_s)]
    return [HOLDER_NAME, str(listener), str(worker_uid), str(spec_fd), str(userns_fd),
            *lease_args, str(ready_fd), str(service_fd), str(spawner_fd)]


def _split(keeper: Keeper, spec: dict[str, Any], idle_s: float) -> None:
    """Become the holder (this process, pid 1, execs it) and fork the service that serves
    until idle. The exec comes before any call runs: exec makes a process dumpable, and
    the holder's first act undoes it, before the service reads a message. Returns in the
    service, or here when the exec failed (then this process keeps serving, as pid 1)."""
    holder_fd = int(spec["holder_fd"])
    userns = keeper.who.userns_fd if keeper.who is not None else -1
    spec_fd = _sealed(json.dumps(service_spec(spec, keeper.who, idle_s)).encode(),
                      "bashfleet-service")
    service_end, holder_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
    if os.fork() == 0:
        proto.close_all([ready_write, holder_fd, spec_fd, holder_end.detach()])
        ready = _read_some(ready_read) == b"ready\n"
        os.close(ready_read)
        if not ready:
            os._exit(0)  # the exec failed: pid 1 serves on
        keeper.lease = None  # the holder ends the workspace with its lease
        keeper.idle_s = idle_s
        keeper.link = service_end
        return
    service_end.close()
    os.close(ready_read)
    lease = keeper.lease
    # The spawner goes with the user namespace it serves: a woken service's calls start
    # as this one's do.
    spawner = keeper.spawner if userns >= 0 else -1
    kept = [keeper.listener.fileno(), spec_fd, userns, ready_write, holder_end.fileno(),
            lease.dir_fd if lease is not None else -1, int(spec.get("slot_fd", -1)), spawner]
    for fd in kept:
        if fd >= 0:
            os.set_inheritable(fd, True)  # the slot's lock too: pid 1 holds it for good
    argv = holder_argv(keeper.listener.fileno(), keeper.worker_uid, spec_fd=spec_fd,
                       userns_fd=userns, lease=lease, ready_fd=ready_write,
                       service_fd=holder_end.fileno(), spawner_fd=spawner)
    try:
        # execveat(fd, "", AT_EMPTY_PATH) (glibc's fexecve): the binary was opened before
        # the view; no path of the workspace is looked up, and it loads nothing (static).
        os.execve(holder_fd, argv, {})  # noqa: S606 - a binary by fd, no shell
    except OSError:
        proto.close_all([ready_write, spec_fd, holder_end.detach()])


def _sealed(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    return fd


def _read_some(fd: int) -> bytes:
    """What `fd` gives until its writers close it or a line arrives."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return data


def wake(service: dict[str, Any], fds: WakeFds, seccomp: kernel.SyscallFilter | None,
         report_fd: int) -> int:
    """A woken service, forked by the zygote's helper into a sleeping workspace's
    namespaces (its mount view is the workspace's: nothing is imported or exec'd here):
    what `_enter` and `_setup_view` gave the first keeper, then serve until idle."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    for target in (0, 1, 2):
        os.dup2(fds.null, target)
    os.close(fds.null)
    os.setsid()
    os.umask(0o022)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    _own_session_keyring()
    kernel.drop_privileges_of_children()
    who = None
    if service.get("who") is not None:
        uid, gid, groups = service["who"]
        who = kernel.Identity(int(uid), int(gid), tuple(groups), fds.userns)
        if service.get("run_user"):
            os.setgroups(list(groups))
            os.setresgid(gid, 0, 0)
            os.setresuid(uid, 0, 0)
    listener = socket.socket(fileno=fds.listener)
    listener.setblocking(False)
    keeper = Keeper(listener, worker_uid=int(service["worker_uid"]), who=who,
                    host_proc=fds.host_proc)
    keeper.seccomp = seccomp
    keeper.spawner = fds.spawner
    if service.get("open_files") is not None:
        keeper.open_files = int(service["open_files"])
    keeper.idle_s = float(service["idle_s"])
    keeper.link = socket.socket(fileno=fds.link)
    os.write(report_fd, proto.report_line("ready"))
    os.close(report_fd)
    return keeper.serve()


@dataclasses.dataclass(frozen=True)
class WakeFds:
    """What a woken service is given: the workspace's listening socket, its user
    namespace (-1: none), the connection the holder answered (held while the service
    lives: its end tells the holder to listen again), the host's /proc and /dev/null
    (opened before entering the view), the spawner binary (-1: none; the holder keeps
    it for the services it wakes)."""

    listener: int
    userns: int
    link: int
    host_proc: int
    null: int
    spawner: int = -1


def _any_readable(fds: list[int]) -> bool:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


def _claimed(listener: socket.socket, spec: dict[str, Any]
             ) -> tuple[socket.socket, dict[str, Any], kernel.Identity | None]:
    """A blank keeper waits for the worker that claims it, and builds the view it is sent
    (exiting when it cannot: the worker makes the workspace again). The descriptors of
    the claim (its id slot's lock) are held for good: open while the keeper lives."""
    maker = int(spec.get("maker_fd", -1))
    # Not blocking: a connection the poll saw may be gone when accept comes (a keeper
    # blocked in accept then outlived its maker: found left over after a CI run). Back
    # to the poll instead, which watches the maker too.
    listener.setblocking(maker < 0)
    while True:
        if maker >= 0 and _first_ready([listener.fileno(), maker]) == maker:
            os._exit(0)  # the worker process that made it ahead is gone: none will claim it
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            continue
        sock.setblocking(True)
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if pid != 0 or uid != int(spec["worker_uid"]):
            sock.close()
            continue
        tag, body, fds = proto.recv(sock)
        if tag != b"V":
            proto.close_all(fds)
            sock.close()
            continue
        claimed = {**body, "network": spec.get("network", True),
                   "worker_uid": spec["worker_uid"], "seccomp": spec.get("seccomp"),
                   "slot_fd": spec.get("slot_fd", -1)}
        lease_fd = None
        try:
            if claimed.get("lease"):
                # Opened before the view hides the host's state directory.
                lease_fd = os.open(claimed["lease"]["dir"], os.O_PATH | os.O_DIRECTORY
                                   | os.O_CLOEXEC)
            claimed.update(_binary_fds(claimed))
            who = _setup_view(claimed)
        except OSError as exc:
            with contextlib.suppress(OSError):
                proto.send(sock, b"E", proto.error_body(exc))
            os._exit(1)
        proto.send(sock, b"v", proto.PingAnswer(pid=os.getpid()))
        if maker >= 0 and not claimed.get("bound_to_maker"):
            os.close(maker)  # a workspace now: it outlives the worker that made it
            maker = -1
        # A throwaway workspace stays bound to its maker: it serves that worker's calls
        # alone, until a job of one outlives its call (`X`).
        return sock, {**claimed, "maker_fd": maker, "lease_fd": lease_fd}, who


def _binary_fds(spec: dict[str, Any]) -> dict[str, int]:
    """The holder binary, when this keeper may sleep, and the spawner, when it starts its
    calls by one (`spawn.c`'s binary), opened now: before the view, after which
    a path is the workspace's. One that cannot be opened is left out: the keeper then
    stays awake, or forks its calls."""
    opened = {}
    wanted = {"holder_fd": spec.get("holder") if float(spec.get("idle_s") or 0) else None,
              "spawner_fd": spec.get("spawner") if spec.get("ids") is not None else None}
    for key, path in wanted.items():
        if path:
            with contextlib.suppress(OSError):
                opened[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    return opened


def _enter(spec: dict[str, Any]) -> int:
    """Namespaces are made (by the helper); here: this process's own setup. Returns a
    descriptor of the host's /proc."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    # The worker's stdio (a terminal, a log, a test's pipe) is not the keeper's to hold:
    # it outlives the worker.
    null = os.open("/dev/null", os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    os.setsid()
    # The directories the view makes, and what calls create, get the usual modes
    # whatever umask the worker had.
    os.umask(0o022)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    _own_session_keyring()
    if not spec.get("network", True):
        kernel.loopback_up()
    # The host's /proc, kept to read a call's host pid from a pidfd (close-on-exec).
    return os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _own_session_keyring() -> None:
    """The workspace's calls get a session keyring of their own: the keeper's, inherited
    from the worker, is every workspace's, and its keys are any holder's to read (a
    possessor needs no matching uid), whatever user namespace a call is in. Where the
    kernel refuses (a worker in a container whose own filter denies keyctl), calls
    cannot reach a keyring either."""
    with contextlib.suppress(OSError):
        kernel.join_new_session_keyring()


def syscall_filter_for(spec: dict[str, Any]) -> kernel.SyscallFilter | None:
    """The calls' system call filter as `spec` asks (a woken service's, made before it
    enters the view)."""
    return _syscall_filter(spec)


def _syscall_filter(spec: dict[str, Any]) -> kernel.SyscallFilter | None:
    """The filter the workspace's calls run under, made now (before the view hides the
    standard library): the host's `seccomp` setting, `default` when the spec does not
    say (the sandbox's probe)."""
    program = syscall_filter.for_mode(str(spec.get("seccomp") or "default"), platform.machine())
    return None if program is None else kernel.syscall_filter(program)


#: What a blank keeper made ahead of its claim: its user namespace (`userns`).
_prepared: dict[str, int] = {}


def _user_namespace(ids: dict[str, Any]) -> int:
    return kernel.new_user_namespace(f"0 {ids['uid']} {ids['count']}\n",
                                     f"0 {ids['gid']} {ids['count']}\n")


def _prepare(spec: dict[str, Any]) -> None:
    """A blank keeper with host ids: its user namespace now, and the host's root in its
    own layers (`prebuild`), so that its claim has only the workspace's paths to bind."""
    ids = spec.get("ids")
    if ids is None:
        return
    _prepared["userns"] = _user_namespace(ids)
    if spec.get("prebuild"):
        view.carry_out(spec["prebuild"], userns_fd=_prepared["userns"])


def _setup_view(spec: dict[str, Any]) -> kernel.Identity | None:
    """The view, then what calls must not have; who calls run as.

    With `ids` (a root worker's workspace): a user namespace of its own mapped to its
    host ids, through which an image's and a snapshot's layers show their files (idmapped
    mounts; the host's own directories keep the host's ids) and
    which every call enters as `user` (root inside by default). The keeper itself stays
    root on the host, outside that namespace: nothing a call does reaches it.
    Else with `uid` (a root worker on a single-tenant host): calls run as the run user."""
    ids = spec.get("ids")
    userns = project = -1
    if ids is not None:
        userns = _prepared.get("userns", -1)
        if userns < 0:
            userns = _user_namespace(ids)
        if ids.get("shared") and any(step[0] == "idbind" for step in spec["plan"]):
            owner_uid, owner_gid = ids["shared"]
            project = kernel.new_user_namespace(f"{owner_uid} {ids['uid']} 1\n",
                                                f"{owner_gid} {ids['gid']} 1\n")
    view.carry_out(spec["plan"], userns_fd=userns, project_fd=project)
    if project >= 0:
        os.close(project)
    kernel.drop_privileges_of_children()
    if ids is not None:
        uid, gid, groups = spec.get("user") or (0, 0, [])
        return kernel.Identity(int(uid), int(gid), tuple(groups), userns)
    if spec.get("uid") is not None:
        os.setgroups(spec.get("groups") or [])
        os.setresgid(spec["gid"], 0, 0)
        # Real uid the run user's, effective root: the keeper keeps what it needs (its
        # capabilities); each call's child takes the run user's ids before anything.
        os.setresuid(spec["uid"], 0, 0)
        return kernel.Identity(spec["uid"], spec["gid"], tuple(spec.get("groups") or ()))
    return _own_namespace_as_myself()


def _own_namespace_as_myself() -> kernel.Identity | None:
    """A worker that is not root: its calls keep its uid (single-tenant), in a user
    namespace of the workspace's own mapping that uid alone: a kernel keyring (and a
    user namespace's other per-namespace state) of its own, not every workspace's. None
    where the kernel refuses one (calls then share the keeper's)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        userns = kernel.new_user_namespace(f"{uid} {uid} 1\n", f"{gid} {gid} 1\n")
    except OSError:
        return None
    return kernel.Identity(uid, gid, (), userns)
