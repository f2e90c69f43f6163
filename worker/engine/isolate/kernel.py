"""The system calls the sandbox makes that Python 3.11's os module does not offer.

Standard library only (ctypes): the zygote and the keepers run it as `python -I -S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import platform
import resource
import signal
import socket
import struct
import sys
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from bashfleet.worker.engine.isolate import SPAWN_NAME

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
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
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCSIFADDR = 0x8916
SIOCSIFNETMASK = 0x891C
SIOCADDRT = 0x890B
IFF_UP = 1
RTF_UP = 0x1
RTF_GATEWAY = 0x2
#: A route's "any destination" and "any mask" (a route's, not an address bound to).
ANY_ADDRESS = "0.0.0.0"  # noqa: S104
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000
OPEN_TREE_CLONE = 1
O_CLOEXEC = 0o2000000
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 4
#: Flags a remount must repeat (in a user namespace they are locked): statvfs's ST_*
#: values are the MS_* ones.
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # NOATIME, NODIRATIME, RELATIME

_SYSCALLS = {
    # machine: (pivot_root, mount_setattr, open_tree, move_mount, capset, keyctl); the
    # middle three are the generic table's on both.
    "x86_64": (155, 442, 428, 429, 126, 250),
    "aarch64": (41, 442, 428, 429, 91, 219),
}

_libc = ctypes.CDLL(None, use_errno=True)
#: This machine's (pivot_root, mount_setattr, open_tree, move_mount) numbers, looked up
#: once: a keeper must import nothing once its view is built (the stdlib may be out of
#: sight).
_NUMBERS: tuple[int | None, ...] = _SYSCALLS.get(platform.machine(), (None,) * 6)
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_LINK = 8
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4


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
    """Make the mount at `path` and every mount under it read-only (`set_tree_attrs`)."""
    set_tree_attrs(path, MOUNT_ATTR_RDONLY)


def set_tree_attrs(path: str, attrs: int) -> None:
    """Set mount attributes (`MOUNT_ATTR_*`) on the mount at `path` and every mount under
    it: mount_setattr(2) with AT_RECURSIVE (Linux 5.12+); on older kernels a remount of
    each, with the read-only, nosuid and nodev flags."""
    number = _NUMBERS[1]
    if number is not None:
        attr = _MountAttr(attrs, 0, 0, 0)
        result = _libc.syscall(ctypes.c_long(number), ctypes.c_int(AT_FDCWD), _raw(path),
                               ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr),
                               ctypes.c_size_t(ctypes.sizeof(attr)))
        if result == 0:
            return
        if ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL):
            _check(result, f"mount_setattr {path}")
    flags = ((MS_RDONLY if attrs & MOUNT_ATTR_RDONLY else 0)
             | (MS_NOSUID if attrs & MOUNT_ATTR_NOSUID else 0)
             | (MS_NODEV if attrs & MOUNT_ATTR_NODEV else 0))
    for target in mounts_under(path):
        kept = os.statvfs(target).f_flag & KEPT_FLAGS
        mount(None, target, None, MS_REMOUNT | MS_BIND | flags | kept)


def mounts_under(path: str) -> list[str]:
    """Mount points at or under `path`, parents first (from /proc/self/mountinfo)."""
    prefix = path.rstrip("/") + "/"
    with open("/proc/self/mountinfo", "rb") as info:
        found = [point for point in mount_points(info.read())
                 if point == path or point.startswith(prefix)]
    return sorted(set(found), key=len)


def mount_points(mountinfo: bytes) -> list[str]:
    """The mount points a mountinfo text lists (its fifth field, unescaped), in order."""
    return [os.fsdecode(_unescape(fields[4])) for line in mountinfo.splitlines()
            if len(fields := line.split()) > 4]


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


def _number(index: int, what: str) -> int:
    number = _NUMBERS[index]
    if number is None:
        raise OSError(errno.ENOSYS, f"{what}: unknown machine")
    return number


def drop_capabilities() -> None:
    """capset(2): this process keeps no capability (a keeper's child that takes no other
    ids would keep the keeper's until its exec)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.syscall(ctypes.c_long(_number(4, "capset")), ctypes.byref(header),
                         ctypes.byref(data)), "capset")


def setns(fd: int, nstype: int) -> None:
    """setns(2): os.setns is Python 3.12+."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


T = TypeVar("T")


def in_network_namespace(pid: int, action: Callable[[], T], name: str) -> T:
    """`action`'s value, run in the network namespace of process `pid` by a thread
    (`name`) that enters it and ends there: a namespace is a thread's own, so the
    process's other threads stay in the host's. What it raises is raised here."""
    done: list[T] = []
    failed: list[BaseException] = []

    def inside() -> None:
        try:
            netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                setns(netns, CLONE_NEWNET)
            finally:
                os.close(netns)
            done.append(action())
        except BaseException as exc:  # raised in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=inside, name=name, daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]


def idmapped_tree(source: str, userns_fd: int, *, read_only: bool = True) -> int:
    """A detached copy of the mount tree at `source` whose files' ids are shown through
    the user namespace `userns_fd` (host id N as that namespace's N), nosuid, nodev (and
    read-only unless told): a descriptor for `attach`. Needs root on the host (Linux
    5.12+; an overlay over it 5.19+)."""
    flags = OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE
    fd = _libc.syscall(ctypes.c_long(_number(2, "open_tree")), ctypes.c_int(AT_FDCWD),
                       _raw(source), ctypes.c_uint(flags))
    if fd < 0:
        _check(-1, f"open_tree {source}")
    attr = _MountAttr(MOUNT_ATTR_IDMAP | (MOUNT_ATTR_RDONLY if read_only else 0)
                      | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, userns_fd)
    result = _libc.syscall(ctypes.c_long(_number(1, "mount_setattr")), ctypes.c_int(fd),
                           b"", ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE),
                           ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    if result != 0:
        code = ctypes.get_errno()
        os.close(fd)
        raise OSError(code, f"idmapped mount of {source}: {os.strerror(code)}")
    return int(fd)


def attach(tree_fd: int, target: str) -> None:
    """move_mount(2): put a detached tree (`idmapped_tree`) at `target`."""
    result = _libc.syscall(ctypes.c_long(_number(3, "move_mount")), ctypes.c_int(tree_fd),
                           b"", ctypes.c_int(AT_FDCWD), _raw(target),
                           ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))
    _check(result, f"move_mount {target}")


def new_user_namespace(uid_map: str, gid_map: str) -> int:
    """A user namespace with these id maps, as a descriptor (it lives while the
    descriptor is open). A child makes it and waits; we (root on the host) write its
    maps, keep its namespace and let it go."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child exits
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            # Dumpable, so that its /proc files are its user's (a keeper is not): a maker
            # that is not root may then write its maps.
            prctl(PR_SET_DUMPABLE, 1)
            unshare(CLONE_NEWUSER)
            os.write(ready_w, b"1")
            os.read(done_r, 1)  # until the parent is done with us
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "could not make a user namespace")
        # The /proc mounted here may be another PID namespace's than ours (a keeper's,
        # before its view is built, is the host's): the child by the number that /proc
        # gives it.
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            seen = host_pid(pid, proc)
        finally:
            os.close(proc)
        for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
            fd = os.open(f"/proc/{seen}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        return os.open(f"/proc/{seen}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)


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


def join_new_session_keyring() -> int:
    """keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): this process (and every process it
    starts from now on) gets a new anonymous session keyring, not the one it inherited
    (the worker's, shared with every other workspace). Returns its serial."""
    serial = _libc.syscall(ctypes.c_long(_number(5, "keyctl")),
                           ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None)
    if serial < 0:
        _check(-1, "keyctl(JOIN_SESSION_KEYRING)")
    return int(serial)


def link_user_keyring() -> None:
    """keyctl(KEYCTL_LINK, user keyring, session keyring), as a login's pam_keyinit does:
    this process's user keyring becomes reachable from (possessed through) its session
    keyring, so keys it put there are readable again by its later processes."""
    number = _NUMBERS[5]
    if number is not None:
        _libc.syscall(ctypes.c_long(number), ctypes.c_int(KEYCTL_LINK),
                      ctypes.c_int(KEY_SPEC_USER_KEYRING), ctypes.c_int(KEY_SPEC_SESSION_KEYRING))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@dataclasses.dataclass(frozen=True)
class SyscallFilter:
    """A seccomp program ready to install (`install_filter`): made once by the keeper,
    so that a call's child only makes the system call."""

    code: ctypes.Array[ctypes.c_char]
    fprog: _SockFprog


def syscall_filter(program: bytes) -> SyscallFilter:
    """`program` (struct sock_filter records, `syscall_filter.program`) held for the
    kernel."""
    code = ctypes.create_string_buffer(program, len(program))
    return SyscallFilter(code, _SockFprog(len(program) // 8,
                                          ctypes.cast(code, ctypes.c_void_p).value))


def install_filter(prepared: SyscallFilter) -> None:
    """This process, and everything it starts, runs under the filter from now on (it
    cannot be lifted). no_new_privs first: the kernel requires it of a process without
    CAP_SYS_ADMIN, and it is what calls get anyway."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                       ctypes.byref(prepared.fprog), 0, 0), "seccomp")


def loopback_up() -> None:
    """A new network namespace has its loopback down: bring it up, as bubblewrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _interface_up(sock, "lo")


def _interface_up(sock: socket.socket, name: str) -> None:
    request = struct.pack("16sH22x", name.encode(), 0)
    flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", name.encode(),
                                                         flags | IFF_UP))


def _inet(address: str) -> bytes:
    """A `struct sockaddr_in` of an IPv4 address (port 0)."""
    return struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton(address))


class _SockAddr(ctypes.Structure):
    """`struct sockaddr`, bytes as they are (a `c_char` array would stop at a NUL)."""

    _fields_ = [("data", ctypes.c_ubyte * 16)]


class _RouteEntry(ctypes.Structure):
    """`struct rtentry` (SIOCADDRT)."""

    _fields_ = [
        ("pad1", ctypes.c_ulong), ("dst", _SockAddr), ("gateway", _SockAddr),
        ("genmask", _SockAddr), ("flags", ctypes.c_ushort), ("pad2", ctypes.c_short),
        ("pad3", ctypes.c_ulong), ("pad4", ctypes.c_void_p), ("metric", ctypes.c_short),
        ("dev", ctypes.c_char_p), ("mtu", ctypes.c_ulong), ("window", ctypes.c_ulong),
        ("irtt", ctypes.c_ushort),
    ]


def configure_link(name: str, address: str, netmask: str, gateway: str) -> None:
    """In this thread's network namespace: `name` given `address`/`netmask` and up, the
    loopback up, the default route through `gateway` (what `ip addr add`, `ip link set
    up` and `ip route add default via` do, without a process of their own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock.fileno(), SIOCSIFADDR, name.encode().ljust(16, b"\0") + _inet(address))
        fcntl.ioctl(sock.fileno(), SIOCSIFNETMASK,
                    name.encode().ljust(16, b"\0") + _inet(netmask))
        _interface_up(sock, name)
        _interface_up(sock, "lo")
        fcntl.ioctl(sock.fileno(), SIOCADDRT, default_route(gateway))


def default_route(gateway: str) -> bytes:
    """The `struct rtentry` of a default route through `gateway` (SIOCADDRT's argument)."""
    # Destination and mask "any": the default route.
    anywhere = _SockAddr.from_buffer_copy(_inet(ANY_ADDRESS))
    return bytes(_RouteEntry(dst=anywhere, gateway=_SockAddr.from_buffer_copy(_inet(gateway)),
                             genmask=anywhere, flags=RTF_UP | RTF_GATEWAY))


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


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a spawned process is: ids in the user namespace it enters (`userns_fd`; -1:
    this process's own namespace)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    userns_fd: int = -1


#: Signals a child gets back at their defaults (the keeper handles or ignores them).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD,
                    signal.SIGTERM, signal.SIGHUP)


def lowered_nofile(wanted: int) -> int:
    """`wanted` as an RLIMIT_NOFILE this process may set: never above its hard limit
    (raising that takes a privilege a worker that is not root lacks)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def spawn(executable: str | None, argv: Sequence[str], env: Mapping[str, str],
          fds: Sequence[int], targets: Sequence[int], *, cwd: str,
          who: Identity | None = None, ctty: bool = False,
          open_files: int | None = None, file_size: int | None = None,
          seccomp: SyscallFilter | None = None) -> int:
    """Start `argv` in a new session with `fds` as its `targets`, in `cwd`: a fork whose
    child first becomes `who` (enters its user namespace, takes its ids), then enters
    `cwd` as that user (every component of the path checked by the kernel against the
    user who runs there, never against the keeper's root), lowers its RLIMIT_NOFILE to
    `open_files` (soft and hard: it cannot raise it back), sets RLIMIT_FSIZE to
    `file_size` bytes (soft and hard), then execs (`executable`, or
    `argv[0]` searched on the child's PATH from there). With `ctty` fd 0 (a PTY slave)
    becomes its controlling terminal. With `seccomp` the child installs that filter last,
    just before its exec. The child's failure comes back on a close-on-exec
    pipe as an OSError naming `cwd` or the executable, as subprocess reports it. A fork
    of the single-threaded keeper: ~0.5 ms here."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        os.close(read_end)
        _child(executable, argv, env, fds, targets, cwd, who, ctty, write_end,
               open_files=open_files, file_size=file_size, seccomp=seccomp)
    os.close(write_end)
    return _started(pid, read_end, cwd)


def _started(pid: int, report: int, cwd: str) -> int:
    """`pid` once its command runs (its end of the report pipe closed at its exec); the
    OSError it reported when it could not get there (the child reaped)."""
    try:
        chunks = []
        while chunk := os.read(report, 512):
            chunks.append(chunk)
    finally:
        os.close(report)
    if not chunks:
        return pid
    os.waitpid(pid, 0)
    stage, _, rest = b"".join(chunks).decode(errors="replace").partition(" ")
    number, _, name = rest.partition(" ")
    code = int(number) if number.isdigit() else errno.EIO
    raise OSError(code, os.strerror(code), cwd if stage == "cwd" else name)


class SpawnerUnavailableError(OSError):
    """The spawner binary could not be started at all (not the call's failure)."""


def spawn_through(spawner: int, executable: str | None, argv: Sequence[str],  # noqa: PLR0917
                  env: Mapping[str, str], fds: Sequence[int], targets: Sequence[int], *,
                  cwd: str, who: Identity, ctty: bool = False, open_files: int | None = None,
                  file_size: int | None = None, filter_fd: int = -1) -> int | None:
    """`spawn`, by the spawner binary (`spawner`, a descriptor of it) posix_spawned
    through /proc/self/fd: a vfork, not a fork of this process, then the same steps in
    the same order as `_child` (spawn.c), the seccomp program read from `filter_fd`.
    None when a descriptor it passes on has one of the call's numbers (`spawn` then);
    SpawnerUnavailableError when the binary could not be started."""
    passed = [fd for fd in (who.userns_fd, filter_fd) if fd >= 0]
    if {spawner, *passed} & set(targets):
        return None
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    if write_end in targets:
        os.close(read_end)
        os.close(write_end)
        return None
    nofile = lowered_nofile(open_files) if open_files is not None else -1
    fsize = file_size if file_size is not None else -1
    args = [SPAWN_NAME, str(write_end), str(who.userns_fd), str(who.uid), str(who.gid),
            ",".join(str(group) for group in who.groups), cwd, str(nofile), str(fsize),
            "1" if ctty else "0", str(filter_fd), executable or "", str(len(argv)), *argv,
            *(f"{name}={value}" for name, value in env.items())]
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(fds, targets, strict=True)]
    try:
        pid = _start_spawner(spawner, args, [write_end, *passed], actions)
    except SpawnerUnavailableError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return _started(pid, read_end, cwd)


def _start_spawner(spawner: int, args: list[str], inherited: Sequence[int],
                   actions: Sequence[tuple[int, int, int]] = ()) -> int:
    """posix_spawn the spawner binary through /proc/self/fd with `inherited` open across
    its exec for it alone (it closes them, a report descriptor at its own exec): this
    process is single-threaded, nothing else starts meanwhile. Its environment is
    empty: a command's is its only once it is the call's user (spawn.c).
    SpawnerUnavailableError when the binary could not be started."""
    for fd in inherited:
        os.set_inheritable(fd, True)
    try:
        return os.posix_spawn(f"/proc/self/fd/{spawner}", args, {}, file_actions=actions)
    except OSError as exc:
        raise SpawnerUnavailableError(exc.errno or errno.EIO, f"the spawner: {exc}") from exc
    finally:
        for fd in inherited:
            os.set_inheritable(fd, False)


#: How a path or an argument becomes bytes for exec (os.fsencode's encoding).
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()

#: What a ready spawner takes with its call (spawn.c's MAX_CALL_FDS, MAX_CALL_BYTES).
READY_MAX_FDS = 16
READY_MAX_BYTES = 8 << 20


@dataclasses.dataclass
class ReadySpawn:
    """A spawner started before its call (`spawn.c --ready`): the user's ids, session,
    signals and filter taken, waiting on `control` for the call's descriptors and
    arguments. `child_fd` is that socket's number in it (no call may target it)."""

    pid: int
    control: socket.socket
    child_fd: int

    def close(self) -> None:
        self.control.close()


def ready_spawn(spawner: int, who: Identity, filter_fd: int = -1) -> ReadySpawn:
    """Start the spawner `--ready`: it takes every step of `spawn_through` a call's
    arguments do not choose, then waits for `start_ready`. SpawnerUnavailableError when
    the binary could not be started; a step that failed is seen at `start_ready`."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child_fd = theirs.fileno()
    args = [SPAWN_NAME, "--ready", str(child_fd), str(who.userns_fd), str(who.uid),
            str(who.gid), ",".join(str(group) for group in who.groups), str(filter_fd)]
    try:
        pid = _start_spawner(spawner, args,
                             [fd for fd in (child_fd, who.userns_fd, filter_fd) if fd >= 0])
    except SpawnerUnavailableError:
        mine.close()
        raise
    finally:
        theirs.close()
    return ReadySpawn(pid, mine, child_fd)


def start_ready(ready: ReadySpawn, executable: str | None, argv: Sequence[str],  # noqa: PLR0917
                env: Mapping[str, str], fds: Sequence[int], targets: Sequence[int], *,
                cwd: str, ctty: bool = False, open_files: int | None = None,
                file_size: int | None = None) -> int | None:
    """Start a call by a ready spawner: `spawn_through`'s steps that depend on the call
    (its descriptors at `targets`, cwd, limits, terminal), then its exec. None when this
    one cannot (it is gone, or failed its own steps; a target is its control socket;
    too many descriptors or bytes): the caller ends it (`end_ready`) and starts the
    call another way. An OSError as `spawn` raises it for what the call itself failed.
    `ready` is used up either way (its socket closed)."""
    fields = [cwd, str(lowered_nofile(open_files) if open_files is not None else -1),
              str(file_size if file_size is not None else -1), "1" if ctty else "0",
              ",".join(str(target) for target in targets), executable or "", str(len(argv)),
              *argv, *(f"{name}={value}" for name, value in env.items())]
    # One encode of the whole, as os.fsencode would encode each field. The file system
    # encoding (UTF-8, or one built on ASCII) makes a 0 byte of NUL alone: one more 0
    # byte than the separators is a NUL inside a field, which would shift every field
    # after it. Such a call is started the usual way, where exec refuses it.
    try:
        text = ("\0".join(fields) + "\0").encode(_FS_ENCODING, _FS_ERRORS)
    except UnicodeEncodeError:
        text = b""
    if text.count(b"\0") != len(fields):
        text = b""
    if (not text or len(text) > READY_MAX_BYTES or len(fds) > READY_MAX_FDS
            or ready.child_fd in targets):
        ready.close()
        return None
    control = ready.control
    try:
        control.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    except BlockingIOError:
        pass  # waiting for its call, as it should be
    else:  # it reported a failed step, or ended
        ready.close()
        return None
    header = struct.pack("=II", len(text), len(fds))
    try:
        sent = control.sendmsg([header, text], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                  struct.pack(f"{len(fds)}i", *fds))])
    except OSError:  # it ended meanwhile
        ready.close()
        return None
    if sent < len(header) + len(text):
        with contextlib.suppress(OSError):  # it ended with part of its call: its report
            control.sendall((header + text)[sent:])  # says why, or its status does
    return _started(ready.pid, control.detach(), cwd)


def end_ready(ready: ReadySpawn) -> None:
    """Kill a ready spawner not used (its keeper reaps it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(ready.pid, signal.SIGKILL)
    ready.close()


def _child(executable: str | None, argv: Sequence[str], env: Mapping[str, str],  # noqa: PLR0917
           fds: Sequence[int], targets: Sequence[int], cwd: str, who: Identity | None,
           ctty: bool, report: int, *, open_files: int | None = None,
           file_size: int | None = None,
           seccomp: SyscallFilter | None = None) -> None:  # pragma: no cover - the child
    stage, name = "setup", ""
    try:
        if who is not None:
            if who.userns_fd >= 0:
                setns(who.userns_fd, CLONE_NEWUSER)
            try:
                os.setgroups(list(who.groups))
            except PermissionError:
                # A namespace made without privilege (a worker that is not root) has
                # setgroups denied, inherited: no supplementary group to drop there.
                if who.groups:
                    raise
            os.setresgid(who.gid, who.gid, who.gid)
            os.setresuid(who.uid, who.uid, who.uid)
            # The workspace's session keyring is the keeper's, new: the user keyring of
            # the ids taken now is linked into it (failure ignored: no keyring then).
            link_user_keyring()
        if who is None or who.uid != 0:
            # The cwd is entered as the user who runs there, with no capability (a
            # namespace's root keeps its own: a container's root).
            drop_capabilities()
        stage = "cwd"
        os.chdir(cwd)
        stage = "setup"
        os.setsid()
        for fd, target in zip(fds, targets, strict=True):
            os.dup2(fd, target)
        # After the dup2s: the engine's descriptors (200 and up) stay open above a lower
        # RLIMIT_NOFILE; only new ones count against it.
        _set_limits(open_files, file_size)
        if ctty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        for signum in _DEFAULT_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        if seccomp is not None:
            # Last, just before the exec: the setup above is the keeper's code; from
            # the exec on everything runs the tenant's, under the filter.
            install_filter(seccomp)
        stage = "exec"
        name = executable or argv[0]
        _exec(executable, argv, env)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.write(report, f"{stage} {exc.errno or errno.EIO} {name}".encode())
    finally:
        os._exit(127)


def _set_limits(open_files: int | None, file_size: int | None) -> None:
    """RLIMIT_NOFILE lowered to `open_files`, RLIMIT_FSIZE set to `file_size` bytes (soft
    and hard each; None: left as they are)."""
    if open_files is not None:
        wanted = lowered_nofile(open_files)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
    if file_size is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))


def _exec(executable: str | None, argv: Sequence[str], env: Mapping[str, str]) -> None:
    """execve `executable`, or argv[0] on env's PATH as execvp searches it (here, as the
    user and in the view the command runs in: what it can run, not what we can)."""
    if executable is not None or "/" in argv[0]:
        os.execve(executable or argv[0], list(argv), dict(env))  # noqa: S606 - argv, no shell
    last: OSError = FileNotFoundError(errno.ENOENT, "No such file or directory", argv[0])
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(folder or ".", argv[0]), list(argv), dict(env))  # noqa: S606
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            last = exc
    raise last


# ------------------------------------------------------------------------- nftables


_nft: list[ctypes.CDLL | None] = []
_nft_found: list[bool] = []


def nftables_installed() -> bool:
    """Whether libnftables is installed, found without loading it in this process."""
    if not _nft_found:
        import ctypes.util  # noqa: PLC0415 - runs ldconfig: only where rules are loaded

        _nft_found.append(ctypes.util.find_library("nftables") is not None)
    return _nft_found[0]


def nftables() -> ctypes.CDLL | None:
    """libnftables (what `nft` itself calls), its functions typed; None where it is not
    installed."""
    if not _nft:
        try:
            library = ctypes.CDLL("libnftables.so.1")
        except OSError:
            _nft.append(None)
            return None
        library.nft_ctx_new.restype = ctypes.c_void_p
        library.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for name in ("nft_ctx_free", "nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(library, name).argtypes = [ctypes.c_void_p]
        library.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        library.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        library.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        _nft.append(library)
    return _nft[0]


def nft_run(library: ctypes.CDLL, text: str) -> str | None:
    """Run an nftables script in this thread's network namespace; None, or nft's error."""
    ctx = library.nft_ctx_new(0)
    try:
        library.nft_ctx_buffer_output(ctx)
        library.nft_ctx_buffer_error(ctx)
        if library.nft_run_cmd_from_buffer(ctx, text.encode()) != 0:
            return (library.nft_ctx_get_error_buffer(ctx) or b"").decode()
    finally:
        library.nft_ctx_free(ctx)
    return None
