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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "arbiterd.h"

gpu gpus[ARB_MAX_GPUS];
int gpu_count;

static int dir_fd = -1;
static int epoll_fd = -1;
static int connections;
static volatile sig_atomic_t stopping;

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("gpupool-arbiterd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int answer(conn *c, uint32_t kind, uint32_t arg, uint64_t value) {
    gpupool_arbiter_msg m = {.kind = kind, .arg = arg, .value = value};
    return send(c->fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof m ? 0 : -1;
}

static uint64_t start_time(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    for (int field = 2; p != NULL && field < 22; field++) p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
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

/* ---- the GPUs' views ------------------------------------------------------------------------ */

static gpu *find_gpu(const uint8_t uuid[16], int create) {
    for (int i = 0; i < gpu_count; i++)
        if (memcmp(gpus[i].uuid, uuid, 16) == 0) return &gpus[i];
    if (!create || gpu_count >= ARB_MAX_GPUS) return NULL;
    char name[64];
    int n = snprintf(name, sizeof name, "%s", GPUPOOL_ARBITER_VIEW_PREFIX);
    for (int i = 0; i < 16; i++) n += snprintf(name + n, sizeof name - (size_t)n, "%02x", uuid[i]);
    /* a fresh file each time: a process that still maps an older one reads that one, unharmed */
    unlinkat(dir_fd, name, 0);
    int fd = openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || fchmod(fd, 0644) != 0 || ftruncate(fd, sizeof(gpupool_arbiter_view)) != 0) {
        say("cannot create the view %s: %s", name, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    void *mem = mmap(NULL, sizeof(gpupool_arbiter_view), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) return NULL;
    gpu *g = &gpus[gpu_count++];
    memset(g, 0, sizeof *g);
    memcpy(g->uuid, uuid, 16);
    g->view = mem;
    memcpy(g->view->uuid, uuid, 16);
    g->view->version = GPUPOOL_ARBITER_VERSION;
    g->view->size = sizeof(gpupool_arbiter_view);
    __atomic_store_n(&g->view->magic, GPUPOOL_ARBITER_MAGIC, __ATOMIC_RELEASE);
    return g;
}

static int find_slot(const gpu *g, uint64_t share_id) {
    for (int i = 0; i < GPUPOOL_ARBITER_SHARES; i++)
        if (g->view->share[i].share_id == share_id) return i;
    return -1;
}

static void free_slot(gpu *g, int slot) {
    memset(&g->view->share[slot], 0, sizeof g->view->share[slot]);
    g->priv[slot] = (slot_private){0};
}

/* ---- control: the daemon's registrations ----------------------------------------------------- */

static int do_register(conn *c, const gpupool_arbiter_msg *m) {
    uint32_t weight = (uint32_t)(m->value & 0xff), priority = (uint32_t)(m->value >> 8 & 0xff);
    uint32_t policy = (uint32_t)(m->value >> 16 & 0xff);
    if (m->share_id == 0 || weight < 1 || weight > 100 || priority > 2 || policy > 1)
        return -(int)GPUPOOL_ARB_WHY_INVALID;
    gpu *g = find_gpu(m->uuid, 1);
    if (g == NULL) return -(int)GPUPOOL_ARB_WHY_FULL;
    uint64_t now = now_ns();
    int slot = find_slot(g, m->share_id);
    if (slot >= 0 && g->priv[slot].key != m->key) return -(int)GPUPOOL_ARB_WHY_USER;
    if (slot < 0) {
        slot = find_slot(g, 0);
        if (slot < 0) return -(int)GPUPOOL_ARB_WHY_FULL;
        uint64_t low = lease_floor(g, slot, now);
        g->view->share[slot] = (gpupool_arbiter_share){
            .share_id = m->share_id, .vtime = low == UINT64_MAX ? 0 : low};
        g->priv[slot].key = m->key;
    }
    gpupool_arbiter_share *s = &g->view->share[slot];
    s->weight = weight;
    s->priority = priority;
    s->policy = policy;
    s->uid = m->arg;
    g->priv[slot].owner = c;
    return 1;
}

/* every GPU's slot of the share: its weight changed, or the registration dropped */
static int each_slot(conn *c, const gpupool_arbiter_msg *m) {
    int found = 0;
    for (int i = 0; i < gpu_count; i++) {
        gpu *g = &gpus[i];
        int slot = find_slot(g, m->share_id);
        if (slot < 0 || m->share_id == 0) continue;
        found++;
        if (m->kind == GPUPOOL_ARB_WEIGHT) {
            if (m->value < 1 || m->value > 100) return -(int)GPUPOOL_ARB_WHY_INVALID;
            g->view->share[slot].weight = (uint32_t)m->value;
        } else if (g->view->share[slot].clients == 0) {
            free_slot(g, slot);
        } else {
            g->priv[slot].owner = NULL; /* it goes with its last process */
        }
    }
    (void)c;
    return found > 0 ? found : -(int)GPUPOOL_ARB_WHY_UNKNOWN;
}

static int on_control(conn *c, const gpupool_arbiter_msg *m) {
    int rc;
    if (m->kind == GPUPOOL_ARB_REGISTER) {
        rc = do_register(c, m);
    } else if (m->kind == GPUPOOL_ARB_UNREGISTER || m->kind == GPUPOOL_ARB_WEIGHT) {
        rc = each_slot(c, m);
    } else {
        return -1;
    }
    if (rc < 0) return answer(c, GPUPOOL_ARB_REFUSED, (uint32_t)-rc, 0) == 0 ? 0 : -1;
    return answer(c, GPUPOOL_ARB_OK, (uint32_t)rc, 0);
}

/* ---- clients: the shares' processes --------------------------------------------------------- */

static const char *why_text(uint32_t why) {
    switch (why) {
    case GPUPOOL_ARB_WHY_UNKNOWN: return "no such share on that GPU";
    case GPUPOOL_ARB_WHY_USER: return "the share is another user's";
    case GPUPOOL_ARB_WHY_FULL: return "no slot left on that GPU";
    default: return "a malformed request";
    }
}

static uint32_t hello(conn *c, const gpupool_arbiter_msg *m, int beat_fd) {
    gpu *g = find_gpu(m->uuid, 0);
    int slot = g != NULL && m->share_id != 0 ? find_slot(g, m->share_id) : -1;
    if (slot < 0 || g->priv[slot].key != m->key) return GPUPOOL_ARB_WHY_UNKNOWN;
    gpupool_arbiter_share *s = &g->view->share[slot];
    if (s->uid != GPUPOOL_ARBITER_ANY_UID && s->uid != (uint32_t)c->uid) return GPUPOOL_ARB_WHY_USER;
    int seals = beat_fd >= 0 ? fcntl(beat_fd, F_GET_SEALS) : -1;
    struct stat st;
    /* sealed against shrinking: a client cannot make our reads of its page fault */
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(beat_fd, &st) != 0 ||
        st.st_size < (off_t)sizeof(gpupool_arbiter_beat))
        return GPUPOOL_ARB_WHY_INVALID;
    int entry = -1;
    for (int i = 0; i < GPUPOOL_ARBITER_CLIENTS && entry < 0; i++)
        if (g->clients[i] == NULL) entry = i;
    if (entry < 0) return GPUPOOL_ARB_WHY_FULL;
    void *mem = mmap(NULL, sizeof(gpupool_arbiter_beat), PROT_READ, MAP_SHARED, beat_fd, 0);
    if (mem == MAP_FAILED) return GPUPOOL_ARB_WHY_INVALID;
    c->beat = mem;
    c->gpu = g;
    c->slot = slot;
    c->client = entry;
    g->clients[entry] = c;
    g->view->client[entry] =
        (gpupool_arbiter_client){.pid = c->pid, .slot = (uint32_t)slot, .start = c->start};
    s->clients++;
    s->pid = c->pid;
    return 0;
}

static int on_client(conn *c, const gpupool_arbiter_msg *m, int beat_fd) {
    uint64_t now = now_ns();
    if (c->gpu == NULL) {
        if (m->kind != GPUPOOL_ARB_HELLO) return -1;
        uint32_t why = hello(c, m, beat_fd);
        if (why != 0) {
            say("pid %d (uid %u) refused for share %016llx: %s", (int)c->pid, (unsigned)c->uid,
                (unsigned long long)m->share_id, why_text(why));
            answer(c, GPUPOOL_ARB_REFUSED, why, 0);
            return -1;
        }
        return answer(c, GPUPOOL_ARB_OK, (uint32_t)c->slot, 0);
    }
    switch (m->kind) {
    case GPUPOOL_ARB_ACQUIRE: lease_acquire(c, now); return 0;
    case GPUPOOL_ARB_RELEASE: lease_release(c, m->value, now); return 0;
    case GPUPOOL_ARB_REST: lease_rest(c, now); return 0;
    default: return -1;
    }
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
        conn *c = calloc(1, sizeof *c);
        if (c == NULL) {
            close(fd);
            continue;
        }
        *c = (conn){.fd = fd, .kind = kind, .uid = cred.uid, .pid = cred.pid, .slot = -1};
        c->start = start_time(cred.pid);
        connections++;
        watch(c);
    }
}

/* one message; any descriptor that came with it is the HELLO's beat or is closed */
static void on_readable(conn *c) {
    gpupool_arbiter_msg m;
    char control[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                       .msg_controllen = sizeof control};
    ssize_t n = recvmsg(c->fd, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    int fds[4], nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&h); cm != NULL; cm = CMSG_NXTHDR(&h, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count && nfds < 4; i++) memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
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
