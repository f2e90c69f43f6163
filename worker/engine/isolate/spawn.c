/* A call's first process: what a keeper's fork did in Python, as a program the keeper
 * starts with posix_spawn (a vfork: ~0.5 ms to bash's exec here, where forking the
 * Python keeper took ~3.3 ms, most of a `true` call's cost over a bare task's).
 *
 * Its own binary, with no C library: built `-nostdlib -ffreestanding` (holder.py's
 * `spawn_build_argv`), its entry `_start` below, every system call made directly. A
 * static glibc program spends ~0.3 ms of a call on this VM before its main (the
 * library's CPU feature and cache probing: CPUID instructions, each a trap to the
 * hypervisor), as long as the rest of the spawner's work; this one starts in ~0.05 ms.
 * And nothing of a C library runs while it still holds the keeper's host ids (no
 * GLIBC_TUNABLES read, no locale, no atexit): the link fails on any call into one.
 *
 * The keeper (root on the host, outside the workspace's user namespace) posix_spawns
 * this binary through /proc/self/fd/N, N its descriptor of the binary opened before
 * the view was built: no path of the workspace is looked up (the keeper's mount
 * namespace is not the workspace's to change: its users hold no capability over it).
 * The call's descriptors are already in place (posix_spawn's dup2s). This process
 * then becomes the call's user and execs its command, in the order the keeper's
 * Python child does (`kernel._child`):
 *
 *   enter the workspace's user namespace; take the user's groups, gid and uid; link
 *   the user keyring into the session's; no capability left unless it is root there;
 *   enter the cwd as that user; a new session; RLIMIT_NOFILE lowered; RLIMIT_FSIZE set
 *   (the call's file size limit, when no startup script sets it); the controlling
 *   terminal (a PTY's slave on fd 0); the signals the keeper ignores back at their
 *   defaults; the system call filter last; exec (argv[0] searched on the call's PATH
 *   when no executable is given, as execvp does).
 *
 * What failed is written on REPORT_FD as "STAGE ERRNO NAME" (stage `setup`, `cwd` or
 * `exec`) before it exits 127; REPORT_FD is close-on-exec from the final exec on, so
 * the keeper reads end-of-file once the command runs. Its first act makes it
 * undumpable (an exec makes a process dumpable): no process of the workspace may
 * ptrace it while it holds the keeper's ids.
 *
 *   bashfleet-spawn REPORT_FD USERNS_FD UID GID GROUPS CWD NOFILE FSIZE CTTY FILTER_FD
 *                   EXECUTABLE ARGC ARGV... ENV...
 *   bashfleet-spawn --probe      (prints SPAWN_PROBE_ANSWER: this is the spawner)
 *   bashfleet-spawn --ready CONTROL_FD USERNS_FD UID GID GROUPS FILTER_FD
 *
 * `--ready` starts a call's process before its call is known (a throwaway workspace's
 * next call, started once the last one's processes ended): every step that depends on
 * the workspace alone is taken, the user's ids and keyring, the new session, the
 * signals, the filter (installing one costs ~0.25 ms here, a wait on the other CPU
 * as much as work), then it waits on CONTROL_FD, a stream socket only the keeper holds
 * the other end of, for its call: a header of two 32-bit numbers (the bytes that
 * follow, the descriptors passed with it), the call's descriptors (SCM_RIGHTS), then
 * "CWD NOFILE FSIZE CTTY TARGETS EXECUTABLE ARGC ARGV... ENV..." as NUL-ended strings
 * (TARGETS comma-separated, one per descriptor). It puts the descriptors in place and
 * takes the call's steps (cwd, limits, terminal) under the filter, then execs.
 * CONTROL_FD is its report descriptor, close-on-exec. End-of-file before a call (its
 * keeper gone) ends it quietly.
 *
 * -1 for a descriptor or a limit it has not; GROUPS a comma-separated list ("" for
 * none); EXECUTABLE "" to search ARGV[0]. FILTER_FD holds the seccomp program (struct
 * sock_filter records), read from offset 0. The command's environment comes after its
 * ARGC arguments, never as this process's own: it starts as the keeper's (host) ids.
 */
#include <asm/unistd.h>
#include <linux/capability.h>
#include <linux/errno.h>
#include <linux/fcntl.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/prctl.h>
#include <linux/resource.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <linux/mman.h>
#include <linux/uio.h>
#include <asm/ioctls.h>
#include <asm/signal.h>

/* What `--probe` prints (holder.py checks a prebuilt spawner for it). */
#define SPAWN_PROBE_ANSWER "bashfleet-spawn 2\n"

#define MAX_GROUPS 256
#define MAX_FILTER (4096 * 8)
#define MAX_PATH 4096
/* A ready spawner's call: descriptors passed, bytes of its strings (the keeper starts a
 * call past either the usual way). */
#define MAX_CALL_FDS 16
#define MAX_CALL_BYTES (8UL << 20)
/* The socket ABI's part a ready spawner reads its call with (sys/socket.h's, which a
 * program without a C library does not have): the same on both architectures. */
#define SOCKET_LEVEL 1 /* SOL_SOCKET */
#define RIGHTS 1       /* SCM_RIGHTS */
#define RECV_CLOEXEC 0x40000000 /* MSG_CMSG_CLOEXEC */
#define RECV_CTRUNC 0x8 /* MSG_CTRUNC */
struct message_header {
    void *name;
    int name_len;
    struct iovec *iov;
    unsigned long iov_len;
    void *control;
    unsigned long control_len;
    unsigned int flags;
};
struct control_header {
    unsigned long len;
    int level;
    int type;
};

/* The C library's own real-time signals (NPTL's), below the SIGRTMIN it reports. */
#define LIBC_SIGNAL_FIRST 32
#define LIBC_SIGNAL_LAST 33
/* rt_sigaction's and rt_sigprocmask's size of a signal set: the kernel's, 64 bits. */
#define KERNEL_SIGSET_BYTES 8

/* ------------------------------------------------------------------ system calls */

#if defined(__x86_64__)
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
/* The kernel starts a process with argc at the stack pointer, argv and the environment
 * after it; the ABI wants the stack 16-byte aligned at a call. */
__asm__(".text\n.global _start\n_start:\n"
        "  xor %rbp, %rbp\n  mov %rsp, %rdi\n  and $-16, %rsp\n  call spawn_start\n  hlt\n");
#elif defined(__aarch64__)
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
}
__asm__(".text\n.global _start\n_start:\n"
        "  mov x29, #0\n  mov x30, #0\n  mov x0, sp\n  bl spawn_start\n  brk #0\n");
#else
#error "bashfleet-spawn: no system call stub for this architecture (keepers fork their calls)"
#endif

#define sys0(n) sys6((n), 0, 0, 0, 0, 0, 0)
#define sys1(n, a) sys6((n), (long)(a), 0, 0, 0, 0, 0)
#define sys2(n, a, b) sys6((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define sys3(n, a, b, c) sys6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define sys4(n, a, b, c, d) sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define sys5(n, a, b, c, d, e) sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

/* A system call's answer: -errno for a failure (-4095..-1), else its value. */
static int failed(long ret) { return ret < 0 && ret > -4096; }

static __attribute__((noreturn)) void leave(int status) {
    for (;;) sys1(__NR_exit_group, status);
}

/* The compiler may call these for copies and clears it makes itself (freestanding
 * code must provide them); written byte by byte, never as a call to themselves. */
void *memcpy(void *dest, const void *src, unsigned long n);
void *memmove(void *dest, const void *src, unsigned long n);
void *memset(void *dest, int c, unsigned long n);
int memcmp(const void *a, const void *b, unsigned long n);

void *memcpy(void *dest, const void *src, unsigned long n) {
    volatile unsigned char *d = dest;
    const unsigned char *s = src;
    while (n--) *d++ = *s++;
    return dest;
}

void *memmove(void *dest, const void *src, unsigned long n) {
    volatile unsigned char *d = dest;
    const unsigned char *s = src;
    if (d < s) {
        while (n--) *d++ = *s++;
    } else {
        while (n--) d[n] = s[n];
    }
    return dest;
}

void *memset(void *dest, int c, unsigned long n) {
    volatile unsigned char *d = dest;
    while (n--) *d++ = (unsigned char)c;
    return dest;
}

int memcmp(const void *a, const void *b, unsigned long n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y) return *x - *y;
    return 0;
}

static unsigned long text_len(const char *text) {
    unsigned long n = 0;
    while (text[n]) n++;
    return n;
}

static int same_text(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static int starts_with(const char *text, const char *prefix) {
    while (*prefix)
        if (*text++ != *prefix++) return 0;
    return 1;
}

static const char *find_char(const char *text, char c) {
    for (; *text; text++)
        if (*text == c) return text;
    return 0;
}

/* ------------------------------------------------------------------ reports */

static int report_fd = -1;

static char *put_text(char *at, char *end, const char *text) {
    while (*text && at < end) *at++ = *text++;
    return at;
}

static char *put_number(char *at, char *end, long value) {
    char digits[24];
    int n = 0;
    unsigned long magnitude = value < 0 ? 0UL - (unsigned long)value : (unsigned long)value;
    do digits[n++] = (char)('0' + magnitude % 10); while ((magnitude /= 10) && n < 23);
    if (value < 0 && at < end) *at++ = '-';
    while (n && at < end) *at++ = digits[--n];
    return at;
}

/* "STAGE ERRNO NAME" on the report descriptor, then exit 127. */
static __attribute__((noreturn)) void fail(const char *stage, long err, const char *name) {
    if (report_fd >= 0) {
        char line[MAX_PATH + 64];
        char *end = line + sizeof line, *at = put_text(line, end, stage);
        at = put_text(at, end, " ");
        at = put_number(at, end, err ? err : EIO);
        at = put_text(at, end, " ");
        at = put_text(at, end, name);
        sys3(__NR_write, report_fd, line, at - line);
    }
    leave(127);
}

/* `fail` for a system call's answer, when it failed. */
static long check(long ret, const char *stage, const char *name) {
    if (failed(ret)) fail(stage, -ret, name);
    return ret;
}

/* ------------------------------------------------------------------ arguments */

/* A whole decimal number, as the keeper writes one (`str(int)`): an optional '-', then
 * digits, nothing else, within a long. */
static long whole(const char *text) {
    int negative = *text == '-';
    const char *at = text + negative;
    unsigned long value = 0;
    if (!*at) fail("setup", EINVAL, "bashfleet-spawn");
    for (; *at; at++) {
        if (*at < '0' || *at > '9') fail("setup", EINVAL, "bashfleet-spawn");
        unsigned long digit = (unsigned long)(*at - '0');
        if (value > (0x7fffffffffffffffUL - digit) / 10) fail("setup", ERANGE, "bashfleet-spawn");
        value = value * 10 + digit;
    }
    return negative ? -(long)value : (long)value;
}

/* A comma-separated list of decimal numbers ("" for none): at most `most` of them,
 * each at most `highest` (GROUPS' ids, a ready spawner's TARGETS). */
static unsigned long parse_numbers(const char *text, unsigned int *values, unsigned long most,
                                   unsigned long highest, const char *name) {
    unsigned long count = 0;
    while (*text) {
        if (count == most) fail("setup", E2BIG, name);
        unsigned long value = 0;
        const char *start = text;
        for (; *text >= '0' && *text <= '9'; text++) {
            value = value * 10 + (unsigned long)(*text - '0');
            if (value > highest) fail("setup", ERANGE, name);
        }
        if (text == start || (*text && *text != ',')) fail("setup", EINVAL, name);
        values[count++] = (unsigned int)value;
        if (*text) text++;
    }
    return count;
}

/* ------------------------------------------------------------------ steps */

static void drop_capabilities(void) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
    check(sys2(__NR_capset, &header, data), "setup", "capset");
}

static void install_filter(int fd) {
    static unsigned char program[MAX_FILTER];
    long size = sys4(__NR_pread64, fd, program, sizeof program, 0);
    if (failed(size)) fail("setup", -size, "seccomp");
    if (size <= 0 || size % sizeof(struct sock_filter) != 0 || size == sizeof program)
        fail("setup", EINVAL, "seccomp");
    sys1(__NR_close, fd);
    struct sock_fprog prog = {(unsigned short)(size / sizeof(struct sock_filter)),
                              (struct sock_filter *)program};
    check(sys5(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setup", "no_new_privs");
    check(sys5(__NR_prctl, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0), "setup",
          "seccomp");
}

/* A signal back at its default (an all-zero kernel sigaction: SIG_DFL, no flags, on
 * every architecture's layout). */
static void default_action(int sig) {
    unsigned long action[4] = {0, 0, 0, 0};
    sys4(__NR_rt_sigaction, sig, action, 0, KERNEL_SIGSET_BYTES);
}

/* execvp's search of ARGV[0] on PATH (the call's environment), as kernel._exec does:
 * a folder where it is not is skipped, any other error is kept for the report. */
static __attribute__((noreturn)) void exec_command(const char *executable, char **args,
                                                   char **env) {
    if (*executable || find_char(args[0], '/')) {
        const char *path = *executable ? executable : args[0];
        fail("exec", -sys3(__NR_execve, path, args, env), path);
    }
    const char *path = 0;
    for (char **entry = env; *entry; entry++)
        if (starts_with(*entry, "PATH=")) path = *entry + 5;
    if (path == 0) path = "/bin:/usr/bin";
    long last = ENOENT;
    unsigned long name_len = text_len(args[0]);
    char candidate[MAX_PATH];
    for (const char *folder = path;;) {
        const char *stop = find_char(folder, ':');
        unsigned long len = stop ? (unsigned long)(stop - folder) : text_len(folder);
        const char *dir = len ? folder : ".";
        unsigned long dir_len = len ? len : 1;
        if (dir_len + 1 + name_len < sizeof candidate) {
            memcpy(candidate, dir, dir_len);
            candidate[dir_len] = '/';
            memcpy(candidate + dir_len + 1, args[0], name_len + 1);
            long err = -sys3(__NR_execve, candidate, args, env);
            if (err != ENOENT && err != ENOTDIR) last = err;
        }
        if (!stop) break;
        folder = stop + 1;
    }
    fail("exec", last, args[0]);
}

/* The workspace's user: its user namespace entered, its groups, gid and uid taken, its
 * keyring linked into the session's; no capability left unless it is root there. */
static void become(int userns, long uid, long gid, const char *group_list) {
    static unsigned int groups[MAX_GROUPS];
    unsigned long ngroups = parse_numbers(group_list, groups, MAX_GROUPS, 0xffffffffUL, "groups");
    if (uid >= 0) {
        if (userns >= 0) {
            check(sys2(__NR_setns, userns, CLONE_NEWUSER), "setup", "setns");
            sys1(__NR_close, userns);
        }
        /* A namespace made without privilege has setgroups denied: no group to drop. */
        long ret = sys2(__NR_setgroups, ngroups, groups);
        if (failed(ret) && !(ret == -EPERM && ngroups == 0)) fail("setup", -ret, "setgroups");
        check(sys3(__NR_setresgid, gid, gid, gid), "setup", "setresgid");
        check(sys3(__NR_setresuid, uid, uid, uid), "setup", "setresuid");
        /* The keeper's session keyring is the workspace's; the user's is linked in. */
        sys3(__NR_keyctl, KEYCTL_LINK, KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING);
    }
    if (uid != 0) drop_capabilities();
}

/* A limit, soft and hard (-1: left as it is). */
static void set_limit(int resource, long value, const char *name) {
    if (value < 0) return;
    unsigned long long limit[2] = {(unsigned long long)value, (unsigned long long)value};
    check(sys4(__NR_prlimit64, 0, resource, limit, 0), "setup", name);
}

/* The signals the keeper ignores, and posix_spawn's child the C library's own (an
 * ignored signal stays ignored across an exec), back at their defaults; none blocked. */
static void signals_at_defaults(void) {
    static const int defaults[] = {SIGPIPE, SIGXFSZ, SIGINT, SIGCHLD, SIGTERM, SIGHUP};
    for (unsigned long i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        default_action(defaults[i]);
    for (int sig = LIBC_SIGNAL_FIRST; sig <= LIBC_SIGNAL_LAST; sig++) default_action(sig);
    unsigned long none = 0;
    sys4(__NR_rt_sigprocmask, SIG_SETMASK, &none, 0, KERNEL_SIGSET_BYTES);
}

/* ------------------------------------------------------------------ a ready spawner */

/* `count` bytes from `fd` into `into`; end-of-file before a byte of the call ends this
 * process quietly (its keeper went away), one within it is a failed setup. */
static void read_exactly(int fd, char *into, unsigned long count, int started) {
    while (count) {
        long n = sys3(__NR_read, fd, into, count);
        if (n == -EINTR) continue;
        if (failed(n)) fail("setup", -n, "call");
        if (n == 0) {
            if (!started) leave(0);
            fail("setup", EPROTO, "call");
        }
        into += n, count -= (unsigned long)n, started = 1;
    }
}

static void *take_memory(unsigned long size) {
    long at = sys6(__NR_mmap, 0, (long)size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (failed(at)) fail("setup", -at, "call");
    return (void *)at;
}

/* The call's descriptors, each at its target: first all moved past every target and
 * the control descriptor (a target may be another's number), then each dup'ed to its
 * target (a dup is not close-on-exec), the moved ones close-on-exec. */
static void place_descriptors(const int *fds, unsigned long count, const char *targets) {
    unsigned int at[MAX_CALL_FDS];
    long moved[MAX_CALL_FDS];
    unsigned long n = parse_numbers(targets, at, MAX_CALL_FDS, 0x7fffffffUL, "targets");
    if (n != count) fail("setup", EINVAL, "targets");
    long floor = report_fd;
    for (unsigned long i = 0; i < n; i++) {
        if ((long)at[i] == report_fd) fail("setup", EBADF, "targets");
        if ((long)at[i] > floor) floor = at[i];
    }
    for (unsigned long i = 0; i < n; i++) {
        moved[i] = check(sys3(__NR_fcntl, fds[i], F_DUPFD_CLOEXEC, floor + 1), "setup", "dup");
        sys1(__NR_close, fds[i]);
    }
    for (unsigned long i = 0; i < n; i++)
        check(sys3(__NR_dup3, moved[i], at[i], 0), "setup", "dup");
    for (unsigned long i = 0; i < n; i++) sys1(__NR_close, moved[i]);
}

static __attribute__((noreturn)) void serve_one_call(void) {
    unsigned int header[2];
    /* Room for MAX_CALL_FDS descriptors exactly (CMSG_SPACE): more is MSG_CTRUNC. */
    union {
        struct control_header head;
        char bytes[sizeof(struct control_header) + MAX_CALL_FDS * sizeof(int)];
    } control;
    struct iovec part = {header, sizeof header};
    struct message_header message = {0, 0, &part, 1, control.bytes, sizeof control.bytes, 0};
    long n;
    do n = sys3(__NR_recvmsg, report_fd, &message, RECV_CLOEXEC);
    while (n == -EINTR);
    if (failed(n)) fail("setup", -n, "call");
    if (n == 0) leave(0);
    int fds[MAX_CALL_FDS];
    unsigned long nfds = 0;
    if (message.control_len >= sizeof(struct control_header) &&
        control.head.level == SOCKET_LEVEL && control.head.type == RIGHTS) {
        nfds = (control.head.len - sizeof(struct control_header)) / sizeof(int);
        if (nfds > MAX_CALL_FDS) nfds = MAX_CALL_FDS;
        memcpy(fds, control.bytes + sizeof(struct control_header), nfds * sizeof(int));
    }
    if (message.flags & RECV_CTRUNC) fail("setup", E2BIG, "descriptors");
    read_exactly(report_fd, (char *)header + n, sizeof header - (unsigned long)n, 1);
    if (header[1] != nfds || header[0] == 0 || header[0] > MAX_CALL_BYTES)
        fail("setup", EPROTO, "call");
    char *text = take_memory(header[0] + 1UL);
    read_exactly(report_fd, text, header[0], 1);
    text[header[0]] = 0;
    if (text[header[0] - 1] != 0) fail("setup", EPROTO, "call");
    /* Its strings, in order: the fields, then ARGC arguments, then the environment. */
    unsigned long strings = 0;
    for (unsigned long i = 0; i < header[0]; i++) strings += text[i] == 0;
    if (strings < 7) fail("setup", EPROTO, "call");
    char **list = take_memory((strings + 2) * sizeof(char *));
    char *at = text;
    for (unsigned long i = 0; i < strings; i++) {
        list[i] = at;
        at += text_len(at) + 1;
    }
    const char *cwd = list[0], *targets = list[4], *executable = list[5];
    long nofile = whole(list[1]), fsize = whole(list[2]), ctty = whole(list[3]);
    long nargs = whole(list[6]);
    if (nargs < 1 || (unsigned long)nargs > strings - 7) fail("setup", EINVAL, "call");
    char **args = list + 7, **env = list + 7 + nargs;
    /* ARGV and ENV each end with a NULL of their own: the arguments move down one. */
    memmove(args - 1, args, (unsigned long)nargs * sizeof *args);
    args -= 1;
    args[nargs] = 0;
    list[strings] = 0;
    place_descriptors(fds, nfds, targets);
    check(sys1(__NR_chdir, cwd), "cwd", cwd);
    set_limit(RLIMIT_NOFILE, nofile, "RLIMIT_NOFILE");
    set_limit(RLIMIT_FSIZE, fsize, "RLIMIT_FSIZE");
    if (ctty) check(sys3(__NR_ioctl, 0, TIOCSCTTY, 0), "setup", "TIOCSCTTY");
    exec_command(executable, args, env);
}

static int ready_main(int argc, char **argv) {
    if (argc != 8) return 2;
    report_fd = (int)whole(argv[2]);
    check(sys3(__NR_fcntl, report_fd, F_SETFD, FD_CLOEXEC), "setup", "report");
    int userns = (int)whole(argv[3]);
    long uid = whole(argv[4]), gid = whole(argv[5]);
    int filter = (int)whole(argv[7]);
    become(userns, uid, gid, argv[6]);
    check(sys0(__NR_setsid), "setup", "setsid");
    signals_at_defaults();
    if (filter >= 0) install_filter(filter);
    serve_one_call();
}

static int spawn_main(int argc, char **argv) {
    sys5(__NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc == 2 && same_text(argv[1], "--probe")) {
        long n = sys3(__NR_write, 1, SPAWN_PROBE_ANSWER, sizeof SPAWN_PROBE_ANSWER - 1);
        return n == (long)sizeof SPAWN_PROBE_ANSWER - 1 ? 0 : 1;
    }
    if (argc >= 2 && same_text(argv[1], "--ready")) return ready_main(argc, argv);
    if (argc < 14) return 2;
    report_fd = (int)whole(argv[1]);
    int userns = (int)whole(argv[2]);
    long uid = whole(argv[3]), gid = whole(argv[4]);
    const char *cwd = argv[6];
    long nofile = whole(argv[7]);
    long fsize = whole(argv[8]);
    int ctty = (int)whole(argv[9]);
    int filter = (int)whole(argv[10]);
    const char *executable = argv[11];
    long nargs = whole(argv[12]);
    if (nargs < 1 || nargs > argc - 13) fail("setup", EINVAL, "bashfleet-spawn");
    /* The command's arguments, then its environment, each ended by a NULL of its own
     * (argv's own NULL ends the environment). */
    char **args = argv + 13, **env = argv + 13 + nargs;
    memmove(args - 1, args, (unsigned long)nargs * sizeof *args);
    args -= 1;
    args[nargs] = 0;

    become(userns, uid, gid, argv[5]);
    check(sys1(__NR_chdir, cwd), "cwd", cwd);
    check(sys0(__NR_setsid), "setup", "setsid");
    set_limit(RLIMIT_NOFILE, nofile, "RLIMIT_NOFILE");
    /* What `ulimit -f` in the call's startup script would set (soft and hard). */
    set_limit(RLIMIT_FSIZE, fsize, "RLIMIT_FSIZE");
    if (ctty) check(sys3(__NR_ioctl, 0, TIOCSCTTY, 0), "setup", "TIOCSCTTY");
    signals_at_defaults();
    /* Last before the exec: from here on everything runs the tenant's, filtered. */
    if (filter >= 0) install_filter(filter);
    check(sys3(__NR_fcntl, report_fd, F_SETFD, FD_CLOEXEC), "setup", "report");
    exec_command(executable, args, env);
}

void spawn_start(long *stack);

void spawn_start(long *stack) {
    int argc = (int)stack[0];
    leave(spawn_main(argc, (char **)(stack + 1)));
}
