"""The seccomp filter every call of a sandboxed workspace runs under: which system calls
a tenant's command may make, as a classic BPF program the kernel runs on each of them.

Standard library only (struct), no I/O: a keeper builds it as `python -I -S`, once, and
each call's child installs it just before its exec (`kernel.install_filter`), so bash
and everything it starts (jobs, a PTY's shell) inherit it and cannot drop it.

The policy is containers-common's default profile (`pkg/seccomp/seccomp.json`, the one
podman and CRI-O apply to every container) for a container with podman's default
capabilities (CAP_SYS_CHROOT among them; no CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON,
CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_SYS_TIME...), ported as an allowlist:

- `ALLOWED` run; the profile's argument rules are kept: `personality` only with the
  personas it names, `socket(AF_NETLINK, *, NETLINK_AUDIT)` is EINVAL.
- Everything else is EPERM: the profile's own denials (userfaultfd, kexec, swapon...),
  the calls it grants only with a capability a workspace is not given (bpf,
  perf_event_open, init_module, settimeofday, open_by_handle_at...) and every call it
  does not name (add_key, request_key, io_uring_*).
- Tighter than the profile: `keyctl` is EPERM too, as Docker's and containerd's
  profiles have it (the kernel keyring is not a namespaced resource; the keeper gives
  each workspace a session keyring of its own all the same).
- A number past the highest this table knows is ENOSYS, as the profile's default is: a
  system call newer than the table is one a C library tries and falls back from on
  ENOSYS (an EPERM there would break it).
- Another architecture's calling convention (i386's `int 0x80`, x32's numbers on
  x86_64) is EPERM: the numbers would mean other calls.

Nothing is ever killed (no SECCOMP_RET_KILL): a refused call fails with an errno the
program reports, as in a container.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Literal

from bashfleet.worker.engine.isolate import syscall_numbers

# The kernel's names (linux/filter.h, linux/seccomp.h, linux/audit.h).
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_JA = 0x05
BPF_RET_K = 0x06
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000
#: How far a conditional jump reaches (its offset is one byte).
MAX_CONDITIONAL_JUMP = 255
EPERM = 1
EINVAL = 22
ENOSYS = 38
#: struct seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments; the
#: offsets of their low 32 bits (both architectures here are little-endian).
NR_AT = 0
ARCH_AT = 4


def arg_at(index: int) -> int:
    return 16 + 8 * index


AF_NETLINK = 16
NETLINK_AUDIT = 9
#: The personas `personality` may set or read (the profile's list): Linux, PER_LINUX32,
#: UNAME26 with each, and 0xffffffff (query only).
PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

#: What the profile allows a container with podman's default capabilities, on x86_64
#: and aarch64 (names of other architectures are ignored where absent), minus `keyctl`.
_ALLOWED_NAMES = """
_llseek _newselect accept accept4 access adjtimex alarm arch_prctl arm_fadvise64_64
arm_sync_file_range bind breakpoint brk cacheflush capget capset chdir chmod chown
chown32 chroot clock_adjtime clock_adjtime64 clock_getres clock_getres_time64
clock_gettime clock_gettime64 clock_nanosleep clock_nanosleep_time64 clone clone3 close
close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1
epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd
eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64 fadvise64_64
fallocate fanotify_init fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32
fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsconfig
fsetxattr fsmount fsopen fspick fstat fstat64 fstatat64 fstatfs fstatfs64 fsync
ftruncate ftruncate64 futex futex_time64 futimesat get_mempolicy get_robust_list
get_thread_area getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32
getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid
getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32 getrlimit
getrusage getsid getsockname getsockopt gettid gettimeofday getuid getuid32 getxattr
inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel io_destroy
io_getevents io_setup io_submit ioctl ioprio_get ioprio_set ipc kill
landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32
lgetxattr link linkat listen listxattr llistxattr lremovexattr lseek lsetxattr lstat
lstat64 madvise mbind membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod
mknodat mlock mlock2 mlockall mmap mmap2 modify_ldt mount mount_setattr move_mount
mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64
mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl msgget msgrcv msgsnd msync
munlock munlockall munmap name_to_handle_at nanosleep newfstatat open open_tree openat
openat2 pause pidfd_getfd pidfd_open pidfd_send_signal pipe pipe2 pivot_root pkey_alloc
pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64
process_mrelease process_vm_readv process_vm_writev pselect6 pselect6_time64 ptrace
pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv reboot recv recvfrom
recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr rename renameat renameat2
restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo
rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo
sched_get_priority_max sched_get_priority_min sched_getaffinity sched_getattr
sched_getparam sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64
sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp
select semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64
sendmmsg sendmsg sendto set_mempolicy set_robust_list set_thread_area set_tid_address
set_tls setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32
setitimer setns setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid
setresuid32 setreuid setreuid32 setrlimit setsid setsockopt setuid setuid32 setxattr
shmat shmctl shmdt shmget shutdown sigaltstack signal signalfd signalfd4 sigprocmask
sigreturn socketcall socketpair splice stat stat64 statfs statfs64 statx symlink
symlinkat sync sync_file_range sync_file_range2 syncfs sysinfo syslog tee tgkill time
timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime
timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask umount umount2 uname
unlink unlinkat unshare utime utimensat utimensat_time64 utimes vfork wait4 waitid
waitpid write writev
"""
ALLOWED: frozenset[str] = frozenset(_ALLOWED_NAMES.split())
#: Allowed with a condition on their arguments (see `verdict`).
CONDITIONAL: frozenset[str] = frozenset({"personality", "socket"})

#: Each architecture a filter can be built for: its audit token, its numbers, whether
#: it must refuse x32's.
ARCHES: dict[str, tuple[int, Mapping[str, int], bool]] = {
    "x86_64": (AUDIT_ARCH_X86_64, syscall_numbers.X86_64, True),
    "aarch64": (AUDIT_ARCH_AARCH64, syscall_numbers.AARCH64, False),
}

Mode = Literal["default", "unconfined"]
MODES: tuple[Mode, ...] = ("default", "unconfined")
#: What the filter does with one system call: allow it, fail it with an errno, or look
#: at its arguments (the name of the call whose rule decides).
Action = int | str


def errno_action(code: int) -> int:
    return SECCOMP_RET_ERRNO | code


DENY = errno_action(EPERM)


# ---------------------------------------------------------------------------- the policy


def action_of(name: str | None) -> Action:
    """The action for a call by name (None: a number this table does not name)."""
    if name in CONDITIONAL:
        return name
    return SECCOMP_RET_ALLOW if name in ALLOWED else DENY


def verdict(arch: str, audit_arch: int, nr: int, args: Sequence[int]) -> int:
    """What the filter built for `arch` returns for one system call (`nr` as the kernel
    gives it, a signed 32-bit number; `args` six 64-bit values): the policy, stated
    directly (the program is checked against it)."""
    token, numbers, refuse_x32 = ARCHES[arch]
    if audit_arch != token:
        return DENY
    unsigned = nr & 0xFFFFFFFF
    if refuse_x32 and unsigned & X32_SYSCALL_BIT:
        return DENY
    if unsigned > max(numbers.values()):
        return errno_action(ENOSYS)
    names = [name for name, number in numbers.items() if number == unsigned]
    action = action_of(names[0] if names else None)
    return action if isinstance(action, int) else _conditional(action, args)


def _conditional(name: str, args: Sequence[int]) -> int:
    # Only the low 32 bits count: both arguments are C ints, which the kernel truncates
    # (a comparison of all 64 bits could be passed with high bits set).
    low = [arg & 0xFFFFFFFF for arg in args]
    if name == "personality":
        return SECCOMP_RET_ALLOW if low[0] in PERSONAS else DENY
    if low[0] == AF_NETLINK and low[2] == NETLINK_AUDIT:
        return errno_action(EINVAL)
    return SECCOMP_RET_ALLOW


# ---------------------------------------------------------------------------- the program


def segments(numbers: Mapping[str, int]) -> list[tuple[int, Action]]:
    """The call numbers as ranges of one action: (first number, action), ascending, the
    first at 0; past the highest known number, ENOSYS."""
    by_number = {number: name for name, number in sorted(numbers.items())}
    top = max(by_number)
    found: list[tuple[int, Action]] = []
    for number in range(top + 1):
        action = action_of(by_number.get(number))
        if not found or found[-1][1] != action:
            found.append((number, action))
    found.append((top + 1, errno_action(ENOSYS)))
    return found


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _ret(value: int) -> bytes:
    return _insn(BPF_RET_K, value)


def _leaf(action: Action) -> bytes:
    """The code that ends a call with `action` (the number no longer needed: A reused)."""
    if isinstance(action, int):
        return _ret(action)
    if action == "personality":
        count = len(PERSONAS)
        code = _insn(BPF_LD_W_ABS, arg_at(0))
        for index, persona in enumerate(PERSONAS):
            # Matched: jump over the rest of the list and the DENY, to the ALLOW.
            code += _insn(BPF_JEQ_K, persona, jt=count - index, jf=0)
        return code + _ret(DENY) + _ret(SECCOMP_RET_ALLOW)
    # socket: (AF_NETLINK, *, NETLINK_AUDIT) is EINVAL, anything else runs.
    return (_insn(BPF_LD_W_ABS, arg_at(0)) + _insn(BPF_JEQ_K, AF_NETLINK, jt=0, jf=2)
            + _insn(BPF_LD_W_ABS, arg_at(2)) + _insn(BPF_JEQ_K, NETLINK_AUDIT, jt=1, jf=0)
            + _ret(SECCOMP_RET_ALLOW) + _ret(errno_action(EINVAL)))


def _tree(ranges: Sequence[tuple[int, Action]]) -> bytes:
    """A binary search over `ranges` (the number in A): log2(n) comparisons per call.
    The comparison jumps over the lower half itself when it can (a conditional jump
    reaches 255 instructions); past that, through a long jump (`ja`, 32-bit). Each
    instruction less is less for the kernel to convert and compile as every call's
    spawner installs the filter, and less to run on every system call."""
    if len(ranges) == 1:
        return _leaf(ranges[0][1])
    middle = len(ranges) // 2
    low, high = _tree(ranges[:middle]), _tree(ranges[middle:])
    over_low = len(low) // 8
    if over_low <= MAX_CONDITIONAL_JUMP:
        return _insn(BPF_JGE_K, ranges[middle][0], jt=over_low, jf=0) + low + high
    jump_up = _insn(BPF_JA, over_low)
    return _insn(BPF_JGE_K, ranges[middle][0], jt=0, jf=1) + jump_up + low + high


def program(arch: str) -> bytes:
    """The filter for calls made with `arch`'s convention, as the array of struct
    sock_filter the kernel takes."""
    token, numbers, refuse_x32 = ARCHES[arch]
    head = _insn(BPF_LD_W_ABS, ARCH_AT) + _insn(BPF_JEQ_K, token, jt=1, jf=0) + _ret(DENY)
    head += _insn(BPF_LD_W_ABS, NR_AT)
    if refuse_x32:
        head += _insn(BPF_JSET_K, X32_SYSCALL_BIT, jt=0, jf=1) + _ret(DENY)
    return head + _tree(segments(numbers))


def for_mode(mode: str, machine: str) -> bytes | None:
    """The filter of a host's `seccomp` setting on this machine (`platform.machine()`):
    None when calls run unconfined. A machine it has no table for gets none either
    (said in `bashfleet hosts`)."""
    if mode not in MODES:
        raise ValueError(f"unknown seccomp mode {mode!r}")
    if mode == "unconfined" or machine not in ARCHES:
        return None
    return program(machine)
