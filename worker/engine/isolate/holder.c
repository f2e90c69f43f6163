/* The holder: pid 1 of a sleeping workspace, what keeps its namespaces open.
 *
 * A workspace whose Python keeper (the service, `keeper.py`) went to sleep is this
 * process alone: it holds the PID, mount, IPC (and network) namespaces open by being
 * their pid 1, reaps every process that ends in them (orphans of calls come to pid 1),
 * ends the workspace once its lease is over, and answers the worker that connects while
 * no service runs with one message, `Z` {} and descriptors [listener, spec, userns or
 * none], from which the worker's zygote forks a new service into these namespaces.
 *
 * Why C and static: a Python keeper is ~2.2 MiB of private memory per workspace; this
 * is ~0.1. It is exec'd through a descriptor opened before the workspace's view was
 * built: after it, every path is the workspace's own files, so nothing may be loaded
 * from one (no ld.so, no libc.so: a static binary). Its first act makes it undumpable
 * again (exec set it dumpable): no process of the workspace may ptrace it or read its
 * descriptors. It reads nothing but SO_PEERCRED-checked connections of the worker.
 *
 *   holder LISTEN_FD WORKER_UID SPEC_FD USERNS_FD LEASE_DIR_FD LEASE_NAME TTL_S LOOK_S
 *          GRACE_S READY_FD SERVICE_FD SPAWNER_FD
 *
 * (-1 for a descriptor it has not; LEASE_NAME "-" with no lease.) SERVICE_FD is one
 * end of a socket pair whose other end the running service holds: while it is open the
 * service serves the listener and the holder leaves it alone. It writes "ready\n" on
 * READY_FD once undumpable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct lease {
    int dir_fd;
    const char *name;
    double ttl_s, look_s, grace_s;
};

static long number(const char *text) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || end == text) _exit(2);
    return value;
}

static double seconds(const char *text) {
    char *end;
    double value = strtod(text, &end);
    if (*end || end == text) _exit(2);
    return value;
}

/* Past its TTL and grace, or its record gone: the workspace ends (as keeper.Lease). */
static int lease_over(const struct lease *lease) {
    struct stat st;
    if (lease->dir_fd < 0) return 0;
    if (fstatat(lease->dir_fd, lease->name, &st, 0) != 0) return errno == ENOENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double used = st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
    return now.tv_sec + now.tv_nsec / 1e9 - used > lease->ttl_s + lease->grace_s;
}

static void reap(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

/* Drain what the peer sent (a `C` written before it read our `Z`, never run), closing
 * any descriptor that came with it. 0 once the peer closed. */
static int drain(int fd) {
    char data[4096], control[CMSG_SPACE(64 * sizeof(int))];
    for (;;) {
        struct iovec iov = {data, sizeof data};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t got = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (got == 0) return 0;
        if (got < 0) return errno == EAGAIN || errno == EINTR ? 1 : 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int *fds = (int *)CMSG_DATA(c);
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) close(fds[i]);
        }
    }
}

/* A worker's connection: answered `Z` with what wakes a service; -1 if not the worker. */
static int wake_answer(int listener, uid_t worker_uid, const int *fds, int nfds) {
    int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) return -1;
    struct ucred cred;
    socklen_t size = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &size) != 0 || cred.pid != 0
        || cred.uid != worker_uid) {
        close(conn);  /* a process of the workspace, or another user: never served */
        return -1;
    }
    char body[] = "Z{}";
    struct iovec iov = {body, sizeof body - 1};
    char control[CMSG_SPACE(4 * sizeof(int))];
    memset(control, 0, sizeof control);
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    if (sendmsg(conn, &msg, MSG_NOSIGNAL) < 0) {
        close(conn);
        return -1;
    }
    return conn;
}

int main(int argc, char **argv) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc != 13) return 2;
    int listener = (int)number(argv[1]);
    uid_t worker_uid = (uid_t)number(argv[2]);
    int spec = (int)number(argv[3]), userns = (int)number(argv[4]);
    struct lease lease = {(int)number(argv[5]), argv[6], seconds(argv[7]), seconds(argv[8]),
                          seconds(argv[9])};
    int ready = (int)number(argv[10]), service = (int)number(argv[11]);
    int spawner = (int)number(argv[12]);
    /* The spawner (spawn.c's binary, opened by the first keeper) goes to the services it
     * wakes, beside the user namespace its calls enter. */
    int answer_fds[4] = {listener, spec, userns, spawner};
    int nfds = userns < 0 ? 2 : spawner < 0 ? 3 : 4;

    sigset_t child;
    sigemptyset(&child);
    sigaddset(&child, SIGCHLD);
    sigprocmask(SIG_BLOCK, &child, NULL);
    int sigfd = signalfd(-1, &child, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) return 1;
    if (ready >= 0) {
        if (write(ready, "ready\n", 6) != 6) return 1;
        close(ready);
    }
    int look_ms = lease.dir_fd >= 0 ? (int)(lease.look_s * 1000) : -1;
    struct timespec next = {0};
    for (;;) {
        reap();
        struct pollfd fds[2] = {{sigfd, POLLIN, 0}, {service >= 0 ? service : listener,
                                                     POLLIN, 0}};
        int ready_count = poll(fds, 2, look_ms);
        if (ready_count < 0 && errno != EINTR) return 1;
        if (fds[0].revents) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) > 0) {
            }
        }
        if (fds[1].revents) {
            if (service >= 0) {
                if (!drain(service) || (fds[1].revents & (POLLHUP | POLLERR))) {
                    close(service);  /* the service ended (or the worker let go) */
                    service = -1;
                }
            } else {
                service = wake_answer(listener, worker_uid, answer_fds, nfds);
            }
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (look_ms >= 0 && (now.tv_sec > next.tv_sec
                             || (now.tv_sec == next.tv_sec && now.tv_nsec >= next.tv_nsec))) {
            if (lease_over(&lease)) return 0;  /* pid 1 exits: the kernel ends the rest */
            next = now;
            next.tv_sec += look_ms / 1000;
            next.tv_nsec += (long)(look_ms % 1000) * 1000000L;
            if (next.tv_nsec >= 1000000000L) {
                next.tv_sec++;
                next.tv_nsec -= 1000000000L;
            }
        }
    }
}
