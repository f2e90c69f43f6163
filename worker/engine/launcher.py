"""Sandbox launcher and runners: start `bash -c` calls in namespaces, about as fast as a
plain spawn. Standard library only: it runs as `python -I -S launcher.py FD` inside
bubblewrap, and the job supervisor (which imports no package) loads it by path.

Processes, from the worker down:

    worker (a consumer) ──socketpair──► bwrap ─► launcher        one per sandbox layout
                                                   │ fork, unshare(PID), fork, per runner
                                                   ▼
                                                 runner (pid 1 of its own PID namespace,
                                                   its own mount namespace with a fresh
                                                   /proc, its own network namespace when
                                                   the network is cut)
                                                   │ posix_spawn, per call
                                                   ▼
                                                 bash -c COMMAND (pid 2, its own session)

bubblewrap builds the launcher's mount namespace once (the worker's state directory and
secret files hidden, a minimal /dev, /sys read-only; for `strict` a read-only root with
writable workspace paths). A runner serves calls one after the other: for each it spawns
bash with the call's fds (received over a Unix socket with SCM_RIGHTS), reports bash's
pid as the host sees it, waits for it, then SIGKILLs every process left in its namespace
and reaps them all before it reports the exit status, so nothing a call started
survives it (`setsid`, double forks and daemons included) and the next call finds the
namespace empty but for the runner.

Why a long-lived runner and not a namespace per call (measured on a 2-CPU VM, a `true`
call, median): bwrap per call 3.3 ms against 1.1 ms for a plain spawn; a runner forked
per call into a fresh namespace 1.9-2.4 ms (a Python fork costs 0.3-0.6 ms here, and
the copy-on-write faults of the fresh fork another 0.4 ms on the spawn path); a
long-lived runner 1.2 ms (1.04-1.07x the plain spawn): its memory is warm, and it
spawns with vfork (posix_spawn) as subprocess does.

The worker watches and kills by host pid and process group, as without a sandbox (the
marker sweep stays the fallback); a runner is pid 1 of its namespace, so the call
cannot signal or ptrace it, and it is not dumpable, so /proc/1 tells the call nothing.

Messages are SOCK_SEQPACKET datagrams: one tag byte, then JSON (a memfd passed along
when it is too large for one datagram). On the launcher channel, worker -> launcher:
`N` (a new runner: network, user, capabilities, cgroup fds to pass on) answered by `R`
(its host pid, its socket) or `E`. On a runner's socket: runner -> worker `r` (ready)
once set up; worker -> runner `C` (a call: argv, cwd, env, fd targets, per-call mounts)
with the fds; runner -> worker `P` (bash's host pid) or `E` (errno, message), then `S`
(raw wait status, and whether the runner can serve again).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# --------------------------------------------------------------------- kernel interface

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 1
#: Flags a remount must repeat (in a user namespace they are locked): statvfs's ST_*
#: values are the MS_* ones.
_KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # NOATIME, NODIRATIME, RELATIME

#: Capabilities a call may have when it runs as root: Docker's default set without
#: CAP_MKNOD (with it, root could make a node for the disk and read hidden files off it).
#: Without CAP_SYS_ADMIN it cannot unmount what hides the worker's files.
KEEP_CAPS = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31)

#: Where a call finds the fd of its state file (sessions), and an unsandboxed job those
#: of its cgroup's procs files: high numbers, which scripts (3-9) and bash itself (10
#: and up, moved out of the way of open fds) leave alone.
STATE_FD = 200
CGROUP_FD = 201

#: Largest message sent inline; larger ones travel in a memfd.
INLINE_LIMIT = 64 * 1024
_MAX_FDS = 16
_RECV_SIZE = INLINE_LIMIT + 1024

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def unshare(flags: int) -> None:
    """unshare(2): os.unshare is Python 3.12+."""
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    """mount(2)."""
    def raw(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    result = _libc.mount(
        raw(source), raw(target), raw(fstype), ctypes.c_ulong(flags), raw(data)
    )
    _check(result, f"mount {target}")


def umount(target: str) -> None:
    """umount2(2), detached: a call's last process may still hold it for a moment."""
    _check(_libc.umount2(os.fsencode(target), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument."""
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), 0, 0, 0), "prctl")


# ---------------------------------------------------------------------------- messages


def send(sock: socket.socket, tag: bytes, body: Mapping[str, Any],
         fds: Sequence[int] = ()) -> None:
    """Send one message: a tag, a JSON body, and fds (SCM_RIGHTS)."""
    data = json.dumps(body, separators=(",", ":")).encode("utf-8", "surrogatepass")
    fds = list(fds)
    if len(data) > INLINE_LIMIT:
        fds.append(_memfd(data))
        _send_raw(sock, b"M" + tag, fds)
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
        for fd in received:
            os.close(fd)
        return b"", {}, []
    if data[:1] == b"M":
        tag, memfd = data[1:2], received.pop()
        try:
            body = _read_all(memfd)
        finally:
            os.close(memfd)
        return tag, json.loads(body.decode("utf-8", "surrogatepass")), received
    return data[:1], json.loads(data[1:].decode("utf-8", "surrogatepass")), received


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


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
    Used by runners, job supervisors, and the worker for calls it runs unsandboxed."""

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


# ------------------------------------------------------------------------------ runner


class _Runner:
    """One runner: pid 1 of a PID namespace, serving calls one at a time."""

    def __init__(self, sock: socket.socket, spec: Mapping[str, Any], cgroup_fds: list[int]):
        self.sock = sock
        self.spec = spec
        self.cgroup_fds = cgroup_fds
        self.run_as = spec.get("uid") is not None
        self.hostproc = -1
        self.mounted: list[str] = []

    # ---- setup, once

    def setup(self) -> None:
        """Own session, namespaces, a fresh /proc, bounded capabilities, the call's user."""
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Python's SIGINT handler would let the call (which may signal us: same user)
        # raise KeyboardInterrupt here; with none, pid 1 ignores what its namespace sends.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()
        prctl(PR_SET_DUMPABLE, 0)
        # The host's /proc, kept to read bash's host pid from a pidfd (close-on-exec).
        self.hostproc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        unshare(CLONE_NEWNS | (0 if self.spec.get("network", True) else CLONE_NEWNET))
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _cover_proc()
        if not self.spec.get("network", True):
            _loopback_up()
        # Into the cgroup of the calls it will run, once: bash (and all it starts) is
        # born there, so no call pays for joining it (~40 us of bash each, measured).
        for fd in self.cgroup_fds:
            os.write(fd, b"0")
            os.close(fd)
        self.cgroup_fds = []
        _bound_capabilities(self.spec.get("keep_caps", KEEP_CAPS))
        if self.run_as:
            os.setgroups(self.spec.get("groups", []))
            os.setresgid(self.spec["gid"], 0, 0)
            # Real uid the user's, effective root: the runner keeps its capabilities, and
            # posix_spawn(resetids) makes bash the user before it runs anything.
            os.setresuid(self.spec["uid"], 0, 0)

    # ---- calls, one after the other

    def serve(self) -> None:
        """Serve calls until the worker closes the socket, or a call left a mess."""
        send(self.sock, b"r", {})
        while True:
            tag, request, fds = recv(self.sock)
            if tag != b"C":
                _close_all(fds)
                return
            if not self.call(request, fds):
                return

    def call(self, request: Mapping[str, Any], fds: list[int]) -> bool:
        """Run one call to its end; False when this runner must not serve another."""
        # Its stdout and stderr files, kept to watch their size (the output cap).
        outputs = [os.dup(fd) for fd, target in zip(fds, request["targets"], strict=True)
                   if target in (1, 2)]
        try:
            try:
                pid = self._spawn(request, fds)
            finally:
                _close_all(fds)
        except OSError as exc:
            _close_all(outputs)
            self._undo_mounts()
            send(self.sock, b"E", {
                "errno": exc.errno or errno.EIO, "message": exc.strerror or str(exc),
                "filename": exc.filename,
            })
            return True
        host = _host_pid(pid, self.hostproc)
        # Its start time too, read now: bash may be gone (and reaped) before anyone looks.
        send(self.sock, b"P", {"pid": host, "start_ticks": _start_ticks(host, self.hostproc)})
        try:
            status, capped = _wait_for(pid, _watch(request, outputs),
                                       float(request.get("kill_grace_s") or 0))
        finally:
            _close_all(outputs)
        clean = _end_namespace()
        self._undo_mounts()
        with contextlib.suppress(OSError):
            send(self.sock, b"S", {"status": status, "clean": clean, "capped": capped})
        return clean

    def _spawn(self, request: Mapping[str, Any], fds: list[int]) -> int:
        self._call_mounts(request)
        os.chdir(request["cwd"])
        targets: list[int] = request["targets"]
        actions = [
            (os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(fds, targets, strict=True)
        ]
        env = request["env"]
        executable = request.get("executable") or _find(request["argv"][0], env)
        if request.get("ctty"):
            return spawn_with_ctty(executable, request["argv"], env, fds, targets,
                                   resetids=self.run_as)
        return os.posix_spawn(
            executable, request["argv"], env, file_actions=actions, setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), resetids=self.run_as,
        )

    def _call_mounts(self, request: Mapping[str, Any]) -> None:
        """`strict`: a fresh /tmp; the call's paths (writable or not) that it hides, bound
        back into it; writable paths elsewhere bound read-write over the read-only root."""
        if not request.get("private_tmp"):
            return
        paths: list[tuple[str, bool]] = [(p, bool(w)) for p, w in request.get("paths", [])]
        held = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path, _ in paths}
        try:
            mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
            self.mounted.append("/tmp")
            for path, writable in paths:
                under_tmp = path == "/tmp" or path.startswith("/tmp/")
                if under_tmp or writable:
                    self._bind(held[path], path, writable=writable, make=under_tmp)
        finally:
            _close_all(list(held.values()))

    def _bind(self, fd: int, path: str, *, writable: bool, make: bool) -> None:
        if make:
            os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        self.mounted.append(path)
        kept = os.statvfs(path).f_flag & _KEPT_FLAGS
        mount(None, path, None, MS_REMOUNT | MS_BIND | kept | (0 if writable else MS_RDONLY))

    def _undo_mounts(self) -> None:
        os.chdir("/")
        for path in reversed(self.mounted):
            with contextlib.suppress(OSError):
                umount(path)
        self.mounted.clear()


def spawn_with_ctty(executable: str, argv: Sequence[str], env: Mapping[str, str],
                    fds: Sequence[int], targets: Sequence[int], *, resetids: bool) -> int:
    """Start `argv` in a new session whose controlling terminal is its fd 0 (a PTY slave):
    what posix_spawn cannot do (no TIOCSCTTY), so a fork and exec, with the child's exec
    error reported on a close-on-exec pipe as subprocess does. Only interactive (`pty`)
    calls pay the fork (~0.5 ms here); it is safe in the single-threaded runner and job
    supervisor."""
    import termios  # noqa: PLC0415 - only PTY calls need it

    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        try:
            os.close(read_end)
            os.setsid()
            for fd, target in zip(fds, targets, strict=True):
                os.dup2(fd, target)
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)
            if resetids:
                os.setgid(os.getgid())
                os.setuid(os.getuid())
            os.execve(executable, list(argv), dict(env))  # noqa: S606 - no shell: argv
        except OSError as exc:
            os.write(write_end, str(exc.errno or errno.EIO).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    try:
        answer = _read_all_fd(read_end)
    finally:
        os.close(read_end)
    if answer:
        os.waitpid(pid, 0)
        code = int(answer)
        raise OSError(code, os.strerror(code), executable)
    return pid


def _cover_proc() -> None:
    """Parts of /proc that would let root change the host read-only, as bubblewrap does."""
    for name in ("sys", "sysrq-trigger", "irq", "bus"):
        path = f"/proc/{name}"
        try:
            mount(path, path, None, MS_BIND | MS_REC)
        except OSError:
            continue  # not on this kernel
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY
        mount(None, path, None, MS_REMOUNT | MS_BIND | flags)


def _loopback_up() -> None:
    """A new network namespace has its loopback down: bring it up, as bubblewrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _bound_capabilities(keep: Sequence[int]) -> None:
    """What bash may get: none unless it runs as root (the ambient set is cleared; a
    worker that is not root gets all of them from bwrap in its user namespace, with
    which a call could unmount what hides the worker's files), and as root only `keep`
    (the bounding set)."""
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as handle:
            last = int(handle.read())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        if cap not in keep:
            with contextlib.suppress(OSError):
                prctl(PR_CAPBSET_DROP, cap)


def _find(name: str, env: Mapping[str, str]) -> str:
    """The file execve would run for `name`, by the child's PATH (relative entries are
    relative to the cwd, already entered), as Popen searches."""
    if "/" in name:
        return name
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)


def _read_host_proc(path: str, hostproc: int) -> bytes:
    """The first 4 KiB of a file of the host's /proc (`hostproc`: a descriptor of it)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=hostproc)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _host_pid(pid: int, hostproc: int) -> int:
    """`pid` (in our namespace) as the host sees it: a pidfd's fdinfo, read through the
    host's /proc, says `Pid:` in that /proc's namespace."""
    pidfd = os.pidfd_open(pid)
    try:
        text = _read_host_proc(f"self/fdinfo/{pidfd}", hostproc)
    finally:
        os.close(pidfd)
    for line in text.splitlines():
        if line.startswith(b"Pid:"):
            return int(line.split()[1])
    raise OSError(errno.ENOSYS, "this kernel's pidfd fdinfo has no Pid line")


def _start_ticks(pid: int, hostproc: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time, clock ticks after boot) in the host's
    /proc; None if it cannot be read."""
    try:
        raw = _read_host_proc(f"{pid}/stat", hostproc)
        return int(raw[raw.rfind(b")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _watch(request: Mapping[str, Any], outputs: list[int]) -> CapWatch | None:
    cap = request.get("output_cap")
    return None if cap is None else CapWatch(lambda: files_size(outputs), int(cap))


def _wait_for(pid: int, watch: CapWatch | None, grace_s: float) -> tuple[int, bool]:
    """Reap children (orphans of the namespace come to us) until `pid` ends: its status,
    and whether its output passed the cap. The runner enforces the cap itself: it holds
    the output files, and no worker busy elsewhere (or gone) delays it."""
    if watch is None:
        return _reap_until(pid), False
    pidfd = os.pidfd_open(pid)
    try:
        capped = _watch_output(pidfd, pid, watch, grace_s)
    finally:
        os.close(pidfd)
    return _reap_until(pid), capped


def _watch_output(pidfd: int, pid: int, watch: CapWatch, grace_s: float) -> bool:
    """Until bash ends; once its output passed the cap, stop its group (SIGTERM, and
    SIGKILL `grace_s` later) and return True."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    pause = CAP_MIN_WAIT_S
    while not poller.poll(pause * 1000):
        _reap_orphans(pid)
        over, pause = watch.step()
        if over:
            for signum in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signum)
                if poller.poll(grace_s * 1000):
                    break
            return True
    return False


def _reap_until(pid: int) -> int:
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            return status


def _reap_orphans(keep: int) -> None:
    """Reap the namespace's orphans that ended, never `keep` (bash: its status is read
    by `_reap_until`)."""
    with contextlib.suppress(ChildProcessError):
        while True:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None or info.si_pid == keep:
                return
            os.waitpid(info.si_pid, 0)


#: Seconds the processes left in a namespace get to die of SIGKILL before the runner
#: gives up on serving again (one stuck in the kernel, on a dead NFS server say).
REAP_TIMEOUT_S = 5.0


def _end_namespace() -> bool:
    """SIGKILL every other process of the namespace and reap them; True once none is left.

    kill(-1) from pid 1 reaches every process of the namespace (nested ones included);
    a fork racing it fails, since the parent has SIGKILL pending.
    """
    deadline = time.monotonic() + REAP_TIMEOUT_S
    delay = 0.0005
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _runner_main(sock: socket.socket, spec: Mapping[str, Any], cgroup_fds: list[int]) -> None:
    runner = _Runner(sock, spec, cgroup_fds)
    try:
        runner.setup()
    except OSError as exc:
        with contextlib.suppress(OSError):
            send(sock, b"E", {"errno": exc.errno or errno.EIO, "message": str(exc)})
        return
    runner.serve()


# ---------------------------------------------------------------------------- launcher


def _new_runner(chan: socket.socket, spec: Mapping[str, Any], fds: list[int]) -> None:
    """Fork a runner into a new PID namespace; answer with its pid and socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = _fork_runner(lambda: _runner_main(theirs, spec, fds), close=[chan, ours])
    except OSError as exc:
        send(chan, b"E", {"errno": exc.errno or errno.EIO, "message": str(exc)})
        return
    finally:
        theirs.close()
        _close_all(fds)
    send(chan, b"R", {"pid": pid}, [ours.fileno()])
    ours.close()


def _fork_runner(main: Callable[[], None], close: Sequence[socket.socket]) -> int:
    """Run `main` in a child that is pid 1 of a new PID namespace; its pid (ours).

    A helper child makes the namespace and forks the runner into it, reports its pid
    and exits (the runner is then reparented, and the kernel reaps it: SIGCHLD is
    ignored). unshare(CLONE_NEWPID) in the launcher itself would need setns to come
    back for the next runner, which a launcher in a user namespace (a worker that is
    not root) is not allowed. The extra fork (~0.5 ms) is paid once per runner.
    """
    read_end, write_end = os.pipe()
    try:
        helper = os.fork()
        if helper == 0:
            os.close(read_end)
            _helper(main, close, write_end)  # never returns
        os.close(write_end)
        write_end = -1
        answer = _read_all_fd(read_end)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if not answer.startswith(b"pid "):
        raise OSError(errno.EIO, answer.decode("utf-8", "replace") or "the runner did not start")
    return int(answer.split()[1])


def _helper(main: Callable[[], None], close: Sequence[socket.socket], report: int) -> None:
    code = 1
    try:
        for sock in close:
            sock.close()
        unshare(CLONE_NEWPID)
        runner = os.fork()
        if runner == 0:
            os.close(report)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            gc.enable()
            try:
                main()
                code = 0
            finally:
                os._exit(code)
        os.write(report, f"pid {runner}".encode())
        code = 0
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.write(report, str(exc).encode())
    finally:
        os._exit(code)


def _read_all_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def launcher_main(fd: int) -> int:
    """Serve the launcher channel `fd` until the worker closes it."""
    chan = socket.socket(fileno=fd)
    chan.set_inheritable(False)
    prctl(PR_SET_DUMPABLE, 0)
    # Helpers (and runners that come back to us) are reaped by the kernel.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # Fewer copy-on-write faults in the runners: the collector never touches (writes)
    # the objects that exist now.
    gc.disable()
    gc.freeze()
    while True:
        tag, body, fds = recv(chan)
        if tag == b"":
            return 0
        if tag == b"N":
            _new_runner(chan, body, fds)
        else:
            _close_all(fds)


# ------------------------------------------------------------------------ client side


class SandboxError(OSError):
    """The sandbox could not start a runner or a call (not the command's failure)."""


class RunnerLostError(SandboxError):
    """A runner went away (killed, or its launcher could not make it)."""


def _expect(sock: socket.socket, tags: bytes, timeout: float | None,
            what: str) -> tuple[bytes, dict[str, Any], list[int]]:
    sock.settimeout(timeout)
    try:
        tag, body, fds = recv(sock)
    except TimeoutError:
        raise SandboxError(errno.ETIMEDOUT, f"no answer from the sandbox {what}") from None
    finally:
        sock.settimeout(None)
    if tag == b"":
        raise RunnerLostError(errno.EPIPE, f"the sandbox {what} went away")
    if tag == b"E":
        _close_all(fds)
        raise SandboxError(body.get("errno", errno.EIO), body.get("message", "failed"),
                           body.get("filename"))
    if tag not in tags:
        _close_all(fds)
        raise SandboxError(errno.EPROTO, f"unexpected answer {tag!r} from the sandbox {what}")
    return tag, body, fds


class RunnerClient:
    """The worker's end of one runner."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        """The runner's host pid."""
        self.reusable = True
        self.start_ticks: int | None = None
        """Start time of the last call's bash (clock ticks after boot, host's /proc)."""
        self.capped = False
        """The last call was stopped for passing its output cap."""

    def start(self, request: Mapping[str, Any], fds: Sequence[int],
              timeout: float = 10.0) -> int:
        """Start a call; bash's host pid. SandboxError (errno, filename) when it could not."""
        try:
            send(self.sock, b"C", request, fds)
        except OSError as exc:
            self.reusable = False
            raise RunnerLostError(errno.EPIPE, f"the sandbox runner went away: {exc}") from exc
        try:
            _, body, _ = _expect(self.sock, b"P", timeout, "runner")
        except RunnerLostError:
            self.reusable = False
            raise
        except SandboxError as exc:
            if exc.errno == errno.ETIMEDOUT:
                self.kill()
            raise
        ticks = body.get("start_ticks")
        self.start_ticks = int(ticks) if ticks is not None else None
        return int(body["pid"])

    def wait_status(self, timeout: float | None) -> int:
        """The raw wait status of the call's bash; TimeoutError while it runs.

        A runner that died (SIGKILL from the host ends its namespace) reports SIGKILL.
        """
        self.sock.settimeout(timeout)
        try:
            tag, body, fds = recv(self.sock)
        finally:
            self.sock.settimeout(None)
        _close_all(fds)
        if tag != b"S":
            self.reusable = False
            return signal.SIGKILL
        self.reusable = bool(body.get("clean"))
        self.capped = bool(body.get("capped"))
        return int(body["status"])

    def fileno(self) -> int:
        """Readable when the call's status arrives (or the runner is gone)."""
        return self.sock.fileno()

    def kill(self) -> None:
        """End the runner and so its namespace: every process of its call dies."""
        self.reusable = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Let it go: an idle runner exits at end of file, a busy one after its call."""
        self.sock.close()


def returncode(status: int) -> int:
    """A raw wait status as Popen's returncode (negative: killed by that signal)."""
    return os.waitstatus_to_exitcode(status)


class RunnerProcess:
    """A call run by a runner, with the part of Popen's interface the engine uses."""

    def __init__(self, runner: RunnerClient, pid: int) -> None:
        self.runner = runner
        self.pid = pid
        self.returncode: int | None = None
        self.capped = False
        """The runner stopped the call for passing its output cap."""

    def wait(self, timeout: float | None = None) -> int:
        """The returncode once the call ended; subprocess.TimeoutExpired before."""
        if self.returncode is None:
            try:
                status = self.runner.wait_status(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(["bash"], timeout or 0.0) from None
            self.returncode = returncode(status)
            self.capped = self.runner.capped
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
        return self.runner.fileno()

    def ended(self) -> None:
        """Called once the status is known; the pool takes the runner back here."""
        self.runner.close()


class LauncherClient:
    """The worker's end of a launcher: `argv` runs it (bwrap ... -- python launcher.py),
    with the channel's fd number appended."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*argv, str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=dict(env),
                stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.chan = ours

    def alive(self) -> bool:
        """False once the launcher (or its bwrap) exited."""
        return self.proc.poll() is None

    def runner(self, spec: Mapping[str, Any], fds: Sequence[int] = (),
               timeout: float = 10.0) -> RunnerClient:
        """A new runner, set up and ready (the caller serializes calls to this)."""
        send(self.chan, b"N", spec, fds)
        _, body, received = _expect(self.chan, b"R", timeout, "launcher")
        client = RunnerClient(socket.socket(fileno=received[0]), int(body["pid"]))
        try:
            _expect(client.sock, b"r", timeout, "runner")
        except SandboxError:
            client.kill()
            client.close()
            raise
        return client

    def close(self, timeout: float = 5.0) -> None:
        """Close the channel: the launcher exits (its runners finish their calls)."""
        self.chan.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(launcher_main(int(sys.argv[1])))
