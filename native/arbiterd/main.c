/*
 * gpupool-arbiterd DIR [--idle-exit SECONDS]: the trusted compute arbiter of a node's GPUs.
 *
 * One thread, one epoll: the lease socket (every user's shares), the control socket (root and
 * the arbiter's own user: the daemon, or `gpupool exec` for a private arbiter), a timer. The
 * GPUs' views in DIR are written by this process only. A share's process is accepted for a share
 * only if it knows the share's key and the kernel says its user is the share's (SO_PEERCRED).
 * Whatever a connection sends that is not a well-formed request of its kind is refused, said
 * once on stderr, and ends that connection only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "arbiterd.h"
#include "gpupool_pidstat.h"

static int epoll_fd = -1;
static int connections;
static volatile sig_atomic_t stopping;

/* connections per user: no user can take all of the arbiter's descriptors */
#define PER_USER 256
#define USERS 1024
static struct {
    uid_t uid;
    int count, warned;
} users[USERS];

static int *user_count(uid_t uid, int **warned) {
    int spare = -1;
    for (int i = 0; i < USERS; i++) {
        if (users[i].count > 0 && users[i].uid == uid) {
            *warned = &users[i].warned;
            return &users[i].count;
        }
        if (spare < 0 && users[i].count == 0) spare = i;
    }
    if (spare < 0) return NULL;
    users[spare].uid = uid;
    users[spare].warned = 0;
    *warned = &users[spare].warned;
    return &users[spare].count;
}

static int listen_on(const char *name, mode_t mode) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char path[sizeof addr.sun_path];
    if (fd < 0 || fcntl(dir_fd, F_GETFD) < 0) return -1;
    snprintf(path, sizeof path, "/proc/self/fd/%d/%s", dir_fd, name);
    unlinkat(dir_fd, name, 0);
    /* bound through the directory we opened (never a path an attacker swapped) */
    if ((size_t)snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path) >= sizeof addr.sun_path)
        return -1;
    mode_t old = umask(0777 & ~mode);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
    umask(old);
    if (rc != 0 || fchmodat(dir_fd, name, mode, 0) != 0 || listen(fd, 128) != 0) return -1;
    return fd;
}

static void watch(conn *c) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->fd, &ev);
}

static void drop(conn *c) {
    uint64_t now = now_ns();
    if (c->kind == CONN_CONTROL) {
        for (int i = 0; i < gpu_count; i++)
            for (int s = 0; s < GPUPOOL_ARBITER_SHARES; s++) {
                if (gpus[i].priv[s].owner != c) continue;
                gpus[i].priv[s].owner = NULL;
                if (gpus[i].view->share[s].clients == 0) free_slot(&gpus[i], s);
            }
    } else if (c->gpu != NULL) {
        gpu *g = c->gpu;
        lease_gone(c, now);
        g->clients[c->client] = NULL;
        memset(&g->view->client[c->client], 0, sizeof g->view->client[c->client]);
        gpupool_arbiter_share *s = &g->view->share[c->slot];
        if (--s->clients == 0 && g->priv[c->slot].owner == NULL) free_slot(g, c->slot);
        munmap((void *)c->beat, sizeof(gpupool_arbiter_beat));
    }
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    int *warned = NULL, *count = user_count(c->uid, &warned);
    if (count != NULL && *count > 0) (*count)--;
    free(c);
    connections--;
}

static void accept_on(conn *listener) {
    for (;;) {
        int fd = accept4(listener->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            close(fd);
            continue;
        }
        conn_kind kind = listener->kind == CONN_LEASE_LISTEN ? CONN_CLIENT : CONN_CONTROL;
        /* the control socket is 0600 already; its peer is checked all the same */
        if (kind == CONN_CONTROL && cred.uid != 0 && cred.uid != geteuid()) {
            say("control connection of uid %u refused", (unsigned)cred.uid);
            close(fd);
            continue;
        }
        int *warned = NULL, *count = user_count(cred.uid, &warned);
        int trusted = cred.uid == 0 || cred.uid == geteuid();
        if (count == NULL || (!trusted && *count >= PER_USER)) {
            if (warned != NULL && !(*warned)++)
                say("uid %u has %d connections open: more refused", (unsigned)cred.uid, PER_USER);
            close(fd);
            continue;
        }
        conn *c = calloc(1, sizeof *c);
        if (c == NULL) {
            close(fd);
            continue;
        }
        (*count)++;
        *c = (conn){.fd = fd, .kind = kind, .uid = cred.uid, .pid = cred.pid, .slot = -1};
        c->start = gpupool_start_time(cred.pid);
        connections++;
        watch(c);
    }
}

/* one message; any descriptor that came with it is the HELLO's beat or is closed */
static void on_readable(conn *c) {
    gpupool_arbiter_msg m;
    char control[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
    struct msghdr h = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n = recvmsg(c->fd, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    int fds[4], nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&h); cm != NULL; cm = CMSG_NXTHDR(&h, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count && nfds < 4; i++)
            memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
    int rc;
    if (n <= 0) {
        rc = -1;
    } else if (n != (ssize_t)sizeof m || (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        say("pid %d (uid %u) sent %zd bytes that are no request: disconnected", (int)c->pid,
            (unsigned)c->uid, n);
        rc = -1;
    } else if (c->kind == CONN_CONTROL) {
        rc = on_control(c, &m);
    } else {
        int beat = m.kind == GPUPOOL_ARB_HELLO && nfds == 1 ? fds[0] : -1;
        rc = on_client(c, &m, beat);
        if (rc != 0 && c->gpu == NULL && m.kind != GPUPOOL_ARB_HELLO)
            say("pid %d (uid %u) sent request %u before its HELLO: disconnected", (int)c->pid,
                (unsigned)c->uid, (unsigned)m.kind);
        else if (rc != 0 && c->gpu != NULL)
            say("pid %d (uid %u) sent unknown request %u: disconnected", (int)c->pid,
                (unsigned)c->uid, (unsigned)m.kind);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (rc != 0) drop(c);
}

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static void arm(int timer, uint64_t ns) {
    struct itimerspec t = {.it_value = {.tv_sec = (time_t)(ns / 1000000000ULL),
                                        .tv_nsec = (long)(ns % 1000000000ULL)}};
    timerfd_settime(timer, 0, &t, NULL);
}

static int registered(void) {
    for (int i = 0; i < gpu_count; i++)
        for (int s = 0; s < GPUPOOL_ARBITER_SHARES; s++)
            if (gpus[i].view->share[s].share_id != 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    long idle_exit = 0;
    if (argc == 4 && strcmp(argv[2], "--idle-exit") == 0) idle_exit = strtol(argv[3], NULL, 10);
    if ((argc != 2 && argc != 4) || argv[1][0] != '/' || idle_exit < 0) {
        fprintf(stderr, "usage: gpupool-arbiterd DIR [--idle-exit SECONDS]\n");
        return 2;
    }
    dir_fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dir_fd < 0 || fstat(dir_fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
        say("%s must be a directory of uid %u that nobody else can write", argv[1],
            (unsigned)geteuid());
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* every hand-over waits for this process: ahead of the shares' own threads where it may be
     * (root's; an ordinary user's private arbiter keeps its priority) */
    if (geteuid() == 0) setpriority(PRIO_PROCESS, 0, -10);
    /* as many connections as the system lets this process have */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    static conn lease_l = {.kind = CONN_LEASE_LISTEN}, control_l = {.kind = CONN_CONTROL_LISTEN};
    static conn tick = {.kind = CONN_CLIENT, .fd = -1};
    /* the control socket first: whoever waits for lease.sock finds both */
    control_l.fd = listen_on(GPUPOOL_ARBITER_CONTROL, 0600);
    lease_l.fd = listen_on(GPUPOOL_ARBITER_SOCKET, 0666);
    if (epoll_fd < 0 || timer < 0 || lease_l.fd < 0 || control_l.fd < 0) {
        say("cannot listen in %s: %s", argv[1], strerror(errno));
        return 1;
    }
    watch(&lease_l);
    watch(&control_l);
    tick.fd = timer;
    watch(&tick);
    uint64_t quiet_since = now_ns();
    while (!stopping) {
        struct epoll_event events[64];
        int n = epoll_wait(epoll_fd, events, 64, idle_exit ? 1000 : -1);
        for (int i = 0; i < n; i++) {
            conn *c = events[i].data.ptr;
            if (c == &tick) {
                uint64_t expirations;
                if (read(timer, &expirations, sizeof expirations) < 0) continue;
            } else if (c == &lease_l || c == &control_l) {
                accept_on(c);
            } else {
                on_readable(c);
            }
        }
        uint64_t now = now_ns();
        arm(timer, lease_schedule(now));
        if (connections > 0 || registered()) quiet_since = now;
        if (idle_exit && now - quiet_since > (uint64_t)idle_exit * 1000000000ULL) break;
    }
    unlinkat(dir_fd, GPUPOOL_ARBITER_SOCKET, 0);
    unlinkat(dir_fd, GPUPOOL_ARBITER_CONTROL, 0);
    return 0;
}
