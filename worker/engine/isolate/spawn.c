/* A call's first process: what a keeper's fork did in Python, as a program the keeper
 * starts with posix_spawn (a vfork: ~0.5 ms to bash's exec here, where forking the
 * Python keeper took ~3.3 ms, most of a `true` call's cost over a bare task's).
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
 *   enter the cwd as that user; a new session; RLIMIT_NOFILE lowered; the controlling
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
 *   bashfleet-spawn REPORT_FD USERNS_FD UID GID GROUPS CWD NOFILE CTTY FILTER_FD
 *                   EXECUTABLE ARGC ARGV... ENV...
 *   bashfleet-spawn --probe      (prints SPAWN_PROBE_ANSWER: this binary has the mode)
 *
 * -1 for a descriptor or a limit it has not; GROUPS a comma-separated list ("" for
 * none); EXECUTABLE "" to search ARGV[0]. FILTER_FD holds the seccomp program (struct
 * sock_filter records), read from offset 0. The command's environment comes after its
 * ARGC arguments, never as this process's own: it starts as the keeper's (host) ids,
 * and its C library reads its environment at start (GLIBC_TUNABLES, say), which a
 * call's must not reach before it is the call's user.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* What `--probe` prints (holder.py checks a prebuilt binary for it). */
#define SPAWN_PROBE_ANSWER "bashfleet-spawn 1\n"

#define MAX_GROUPS 256
#define MAX_FILTER (4096 * 8)

static int report_fd = -1;

static void fail(const char *stage, int err, const char *name) {
    if (report_fd >= 0) dprintf(report_fd, "%s %d %s", stage, err ? err : EIO, name);
    _exit(127);
}

static long whole(const char *text) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || end == text) fail("setup", EINVAL, "bashfleet-spawn");
    return value;
}

static size_t parse_groups(const char *text, gid_t *groups) {
    size_t count = 0;
    while (*text) {
        if (count == MAX_GROUPS) fail("setup", E2BIG, "groups");
        char *end;
        errno = 0;
        unsigned long value = strtoul(text, &end, 10);
        if (errno || end == text || (*end && *end != ',')) fail("setup", EINVAL, "groups");
        groups[count++] = (gid_t)value;
        text = *end ? end + 1 : end;
    }
    return count;
}

static void drop_capabilities(void) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) != 0) fail("setup", errno, "capset");
}

static void install_filter(int fd) {
    static unsigned char program[MAX_FILTER];
    ssize_t size = pread(fd, program, sizeof program, 0);
    if (size <= 0 || size % sizeof(struct sock_filter) != 0 || size == sizeof program)
        fail("setup", size < 0 ? errno : EINVAL, "seccomp");
    close(fd);
    struct sock_fprog prog = {(unsigned short)(size / sizeof(struct sock_filter)),
                              (struct sock_filter *)program};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("setup", errno, "no_new_privs");
    if (prctl(PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, &prog, 0, 0) != 0)
        fail("setup", errno, "seccomp");
}

/* execvp's search of ARGV[0] on PATH (the call's environment), as kernel._exec does:
 * a folder where it is not is skipped, any other error is kept for the report. */
static void exec_command(const char *executable, char **args, char **env) {
    if (*executable || strchr(args[0], '/')) {
        execve(*executable ? executable : args[0], args, env);
        fail("exec", errno, *executable ? executable : args[0]);
    }
    const char *path = NULL;
    for (char **entry = env; *entry; entry++)
        if (strncmp(*entry, "PATH=", 5) == 0) path = *entry + 5;
    if (path == NULL) path = "/bin:/usr/bin";
    int last = ENOENT;
    size_t name_len = strlen(args[0]);
    char candidate[4096];
    for (const char *folder = path;;) {
        const char *stop = strchr(folder, ':');
        size_t len = stop ? (size_t)(stop - folder) : strlen(folder);
        const char *dir = len ? folder : ".";
        size_t dir_len = len ? len : 1;
        if (dir_len + 1 + name_len < sizeof candidate) {
            memcpy(candidate, dir, dir_len);
            candidate[dir_len] = '/';
            memcpy(candidate + dir_len + 1, args[0], name_len + 1);
            execve(candidate, args, env);
            if (errno != ENOENT && errno != ENOTDIR) last = errno;
        }
        if (!stop) break;
        folder = stop + 1;
    }
    fail("exec", last, args[0]);
}

int spawn_main(int argc, char **argv);

int spawn_main(int argc, char **argv) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc == 2 && strcmp(argv[1], "--probe") == 0) {
        fputs(SPAWN_PROBE_ANSWER, stdout);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (argc < 13) return 2;
    report_fd = (int)whole(argv[1]);
    int userns = (int)whole(argv[2]);
    long uid = whole(argv[3]), gid = whole(argv[4]);
    static gid_t groups[MAX_GROUPS];
    size_t ngroups = parse_groups(argv[5], groups);
    const char *cwd = argv[6];
    long nofile = whole(argv[7]);
    int ctty = (int)whole(argv[8]);
    int filter = (int)whole(argv[9]);
    const char *executable = argv[10];
    long nargs = whole(argv[11]);
    if (nargs < 1 || nargs > argc - 12) fail("setup", EINVAL, "bashfleet-spawn");
    /* The command's arguments, then its environment, each ended by a NULL of its own
     * (argv's own NULL ends the environment). */
    char **args = argv + 12, **env = argv + 12 + nargs;
    memmove(args - 1, args, nargs * sizeof *args);
    args -= 1;
    args[nargs] = NULL;

    if (uid >= 0) {
        if (userns >= 0) {
            if (setns(userns, CLONE_NEWUSER) != 0) fail("setup", errno, "setns");
            close(userns);
        }
        /* A namespace made without privilege has setgroups denied: no group to drop. */
        if (setgroups(ngroups, groups) != 0 && !(errno == EPERM && ngroups == 0))
            fail("setup", errno, "setgroups");
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) fail("setup", errno, "setresgid");
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) fail("setup", errno, "setresuid");
        /* The keeper's session keyring is the workspace's; the user's is linked in. */
        syscall(SYS_keyctl, KEYCTL_LINK, KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING);
    }
    if (uid != 0) drop_capabilities();
    if (chdir(cwd) != 0) fail("cwd", errno, cwd);
    if (setsid() < 0) fail("setup", errno, "setsid");
    if (nofile >= 0) {
        struct rlimit limit = {(rlim_t)nofile, (rlim_t)nofile};
        if (setrlimit(RLIMIT_NOFILE, &limit) != 0) fail("setup", errno, "RLIMIT_NOFILE");
    }
    if (ctty && ioctl(0, TIOCSCTTY, 0) != 0) fail("setup", errno, "TIOCSCTTY");
    static const int defaults[] = {SIGPIPE, SIGXFSZ, SIGINT, SIGCHLD, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) signal(defaults[i], SIG_DFL);
    /* posix_spawn's child ignores the C library's own signals (32, 33: below SIGRTMIN)
     * up to its exec, and an ignored signal stays ignored across an exec: back to the
     * default, by the system call (the library's sigaction refuses them). An all-zero
     * kernel sigaction is SIG_DFL with no flags on every architecture's layout. */
    for (int sig = 32; sig < SIGRTMIN; sig++) {
        unsigned long dfl[4] = {0, 0, 0, 0};
        syscall(SYS_rt_sigaction, sig, dfl, NULL, sizeof(sigset_t) > 8 ? 8 : sizeof(sigset_t));
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Last before the exec: from here on everything runs the tenant's, filtered. */
    if (filter >= 0) install_filter(filter);
    if (fcntl(report_fd, F_SETFD, FD_CLOEXEC) != 0) fail("setup", errno, "report");
    exec_command(executable, args, env);
    return 127;
}
