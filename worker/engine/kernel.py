"""The system calls the sandbox makes that Python 3.11's os module does not offer.

Standard library only (ctypes): the zygote and the keepers run it as `python -I -S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import signal
import socket
import struct
import termios
from collections.abc import Mapping, Sequence

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
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
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 1
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
#: Flags a remount must repeat (in a user namespace they are locked): statvfs's ST_*
#: values are the MS_* ones.
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # NOATIME, NODIRATIME, RELATIME

_SYSCALLS = {
    # machine: (pivot_root, mount_setattr)
    "x86_64": (155, 442),
    "aarch64": (41, 442),
}

_libc = ctypes.CDLL(None, use_errno=True)
#: This machine's (pivot_root, mount_setattr) numbers, looked up once: a keeper must
#: import nothing once its view is built (the stdlib may be out of sight).
_NUMBERS = _SYSCALLS.get(platform.machine(), (None, None))


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _raw(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def unshare(flags: int) -> None:
    """unshare(2): os.unshare is Python 3.12+."""
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    """mount(2)."""
    result = _libc.mount(
        _raw(source), _raw(target), _raw(fstype), ctypes.c_ulong(flags), _raw(data)
    )
    _check(result, f"mount {target}")


def umount(target: str) -> None:
    """umount2(2), detached: a process may still hold it for a moment."""
    _check(_libc.umount2(os.fsencode(target), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2) (no libc wrapper)."""
    number = _NUMBERS[0]
    if number is None:
        raise OSError(errno.ENOSYS, "pivot_root: unknown machine")
    result = _libc.syscall(ctypes.c_long(number), _raw(new_root), _raw(put_old))
    _check(result, "pivot_root")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def read_only_tree(path: str) -> None:
    """Make the mount at `path` and every mount under it read-only: mount_setattr(2)
    with AT_RECURSIVE (Linux 5.12+); on older kernels each mount is remounted."""
    number = _NUMBERS[1]
    if number is not None:
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        result = _libc.syscall(ctypes.c_long(number), ctypes.c_int(AT_FDCWD), _raw(path),
                               ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr),
                               ctypes.c_size_t(ctypes.sizeof(attr)))
        if result == 0:
            return
        if ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL):
            _check(result, f"mount_setattr {path}")
    for target in mounts_under(path):
        remount_read_only(target)


def mounts_under(path: str) -> list[str]:
    """Mount points at or under `path`, parents first (from /proc/self/mountinfo)."""
    prefix = path.rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            point = os.fsdecode(_unescape(line.split()[4]))
            if point == path or point.startswith(prefix):
                found.append(point)
    return sorted(set(found), key=len)


def _unescape(field: bytes) -> bytes:
    """mountinfo's octal escapes (`\\040` for a space)."""
    out = bytearray()
    i = 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def remount_read_only(path: str) -> None:
    """Remount the bind mount at `path` read-only, repeating its locked flags."""
    kept = os.statvfs(path).f_flag & KEPT_FLAGS
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument."""
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), 0, 0, 0), "prctl")


def drop_privileges_of_children() -> None:
    """What every process this one starts gets: no capability at all (the ambient set
    cleared, the bounding set emptied, so no file capability or setuid binary gives one
    back) and no_new_privs. This process keeps the capabilities it has now."""
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    try:
        # Bytes, not text: no codec is imported lazily once the view hides the stdlib.
        with open("/proc/sys/kernel/cap_last_cap", "rb") as handle:
            last = int(handle.read())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        with contextlib.suppress(OSError):
            prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def loopback_up() -> None:
    """A new network namespace has its loopback down: bring it up, as bubblewrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def read_proc_at(path: str, proc_fd: int) -> bytes:
    """The first 4 KiB of a file of the /proc open as `proc_fd`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def host_pid(pid: int, host_proc: int) -> int:
    """`pid` (in our PID namespace) as the host sees it: a pidfd's fdinfo, read through
    the host's /proc, says `Pid:` in that /proc's namespace."""
    pidfd = os.pidfd_open(pid)
    try:
        text = read_proc_at(f"self/fdinfo/{pidfd}", host_proc)
    finally:
        os.close(pidfd)
    for line in text.splitlines():
        if line.startswith(b"Pid:"):
            return int(line.split()[1])
    raise OSError(errno.ENOSYS, "this kernel's pidfd fdinfo has no Pid line")


def start_ticks(pid: int, proc_fd: int) -> int | None:
    """Field 22 of <proc>/<pid>/stat (start time, clock ticks after boot); None if it
    cannot be read."""
    try:
        raw = read_proc_at(f"{pid}/stat", proc_fd)
        return int(raw[raw.rfind(b")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def find_executable(name: str, env: Mapping[str, str]) -> str:
    """The file execve would run for `name`, by the child's PATH (relative entries are
    relative to the cwd, already entered), as Popen searches."""
    if "/" in name:
        return name
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)


def spawn(executable: str, argv: Sequence[str], env: Mapping[str, str], fds: Sequence[int],
          targets: Sequence[int], *, resetids: bool, ctty: bool = False) -> int:
    """Start `argv` in a new session with `fds` as its `targets`: posix_spawn (vfork, as
    subprocess does: ~0.1 ms), or with `ctty` a fork whose fd 0 (a PTY slave) becomes its
    controlling terminal, which posix_spawn cannot do. `resetids`: the child takes the
    real ids (the run user) before it runs anything."""
    if ctty:
        return _spawn_with_ctty(executable, argv, env, fds, targets, resetids=resetids)
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(fds, targets, strict=True)]
    return os.posix_spawn(
        executable, list(argv), dict(env), file_actions=actions, setsid=True,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM,
                   signal.SIGCHLD, signal.SIGHUP),
        resetids=resetids,
    )


def _spawn_with_ctty(executable: str, argv: Sequence[str], env: Mapping[str, str],
                     fds: Sequence[int], targets: Sequence[int], *, resetids: bool) -> int:
    """A fork and exec, with the child's exec error reported on a close-on-exec pipe as
    subprocess does. Only interactive (`pty`) calls pay the fork (~0.5 ms here); safe in
    the single-threaded keeper and job supervisor."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        try:
            os.close(read_end)
            os.setsid()
            for fd, target in zip(fds, targets, strict=True):
                os.dup2(fd, target)
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD,
                           signal.SIGTERM, signal.SIGHUP):
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
        chunks = []
        while chunk := os.read(read_end, 64):
            chunks.append(chunk)
    finally:
        os.close(read_end)
    if chunks:
        os.waitpid(pid, 0)
        code = int(b"".join(chunks))
        raise OSError(code, os.strerror(code), executable)
    return pid
