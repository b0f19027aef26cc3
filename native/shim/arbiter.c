/*
 * A client of the node's trusted compute arbiter (native/arbiterd): one lease per GPU.
 *
 * A process launches only while it holds its GPU's lease. It asks for the lease on the arbiter's
 * lease socket, saying which share it is (the id and key its launch registered; the kernel tells
 * the arbiter its user), and waits for the grant. It learns from the GPU's view, a file the
 * arbiter alone writes and this process maps read-only, whether it still holds the lease and
 * whether it was asked to give it back; it does so at its next batch, after its own work is done
 * (so that the GPU time its events measure is its own). It tells the arbiter when it launched
 * through a sealed memfd page of its own (its beat): no message per launch, and no clock read
 * either (the time a batch opens, then a count of its launches). The arbiter charges
 * each share the lease time it granted; nothing this process says is taken for GPU time.
 *
 * If the arbiter cannot be reached (not running, killed, the share not registered yet), or its
 * view is not one it wrote, the share holds its compute cap alone (throttle.c: its own bucket, at
 * its percent, whatever its policy), says so once, and tries again about once a second: it
 * rejoins when the arbiter is back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpupool_arbiter.h"
#include "shim.h"

#define GP_IDLE_NS (50 * GP_NS_PER_MS) /* a high share that asked within this is active */
#define GP_RETRY_NS GP_NS_PER_S
/* how often a holder looks whether the arbiter is alive */
#define GP_CHECK_NS (100 * GP_NS_PER_MS)

enum { GP_ARB_UNKNOWN = 0, GP_ARB_JOINED = 1, GP_ARB_LOST = 2, GP_ARB_NONE = -1 };

typedef struct {
    int state;
    int fd;
    const gpupool_arbiter_view *view;
    gpupool_arbiter_beat *beat;
    int slot;
    int resting;
    int said; /* the lost arbiter was reported */
    uint64_t lease;
    uint64_t retry_at, checked_at;
    pthread_mutex_t lock;
} gp_arb_dev;

static const char *arbiter_dir;
static uint64_t share_id, share_key;
static gp_priority priority;
static gp_arb_dev devs[GP_MAX_DEVICES];

void gp_arbiter_configure(const gp_config *cfg) {
    arbiter_dir = cfg->arbiter_dir;
    share_id = cfg->arbiter_share;
    share_key = cfg->arbiter_key;
    priority = cfg->priority;
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        devs[dev] = (gp_arb_dev){.fd = -1, .slot = -1};
        pthread_mutex_init(&devs[dev].lock, NULL);
        if (arbiter_dir == NULL || share_id == 0) devs[dev].state = GP_ARB_NONE;
    }
}

gp_priority gp_arbiter_priority(void) { return priority; }

static void disconnect(gp_arb_dev *d) {
    if (d->fd >= 0) close(d->fd);
    if (d->view != NULL) munmap((void *)d->view, sizeof *d->view);
    if (d->beat != NULL) munmap(d->beat, sizeof *d->beat);
    d->fd = -1;
    d->view = NULL;
    d->beat = NULL;
    d->lease = 0;
    d->slot = -1;
}

static int send_msg(gp_arb_dev *d, uint32_t kind, uint64_t value) {
    gpupool_arbiter_msg m = {.kind = kind, .value = value};
    ssize_t n;
    do n = send(d->fd, &m, sizeof m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof m ? 0 : -1;
}

static int recv_msg(gp_arb_dev *d, gpupool_arbiter_msg *m) {
    ssize_t n;
    do n = recv(d->fd, m, sizeof *m, 0);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof *m ? 0 : -1;
}

/* the beat: a memfd sealed against shrinking, so that the arbiter's reads of it never fault */
static int make_beat(gp_arb_dev *d) {
    int fd = memfd_create("gpupool-beat", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    void *mem = MAP_FAILED;
    if (ftruncate(fd, (off_t)sizeof *d->beat) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        mem = mmap(NULL, sizeof *d->beat, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        close(fd);
        return -1;
    }
    d->beat = mem;
    return fd;
}

static int hello(gp_arb_dev *d, const CUuuid *uuid, int beat_fd, char *why, size_t size) {
    gpupool_arbiter_msg m = {.kind = GPUPOOL_ARB_HELLO, .share_id = share_id, .key = share_key};
    memcpy(m.uuid, uuid->bytes, 16);
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
    struct msghdr h = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&h);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &beat_fd, sizeof(int));
    if (sendmsg(d->fd, &h, MSG_NOSIGNAL) != (ssize_t)sizeof m || recv_msg(d, &m) != 0) {
        snprintf(why, size, "it closed the connection");
        return -1;
    }
    if (m.kind != GPUPOOL_ARB_OK) {
        snprintf(why, size, "it refused the share (reason %u)", m.arg);
        return -1;
    }
    d->slot = (int)m.arg;
    return 0;
}

/* the GPU's view, only as a regular file of the arbiter's own user, of this version and GPU */
static int map_view(gp_arb_dev *d, int dir, const CUuuid *uuid, uid_t owner, char *why,
                    size_t size) {
    char name[64];
    int n = snprintf(name, sizeof name, "%s", GPUPOOL_ARBITER_VIEW_PREFIX);
    for (int i = 0; i < 16; i++)
        n += snprintf(name + n, sizeof name - (size_t)n, "%02x", (unsigned char)uuid->bytes[i]);
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner ||
        st.st_size != (off_t)sizeof(gpupool_arbiter_view)) {
        snprintf(why, size, "%s/%s is not its view of the GPU", arbiter_dir, name);
        if (fd >= 0) close(fd);
        return -1;
    }
    void *mem = mmap(NULL, sizeof *d->view, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) {
        snprintf(why, size, "%s/%s cannot be mapped", arbiter_dir, name);
        return -1;
    }
    d->view = mem;
    if (d->view->magic != GPUPOOL_ARBITER_MAGIC || d->view->version != GPUPOOL_ARBITER_VERSION ||
        d->view->size != sizeof *d->view || memcmp(d->view->uuid, uuid->bytes, 16) != 0) {
        snprintf(why, size, "%s/%s is not a view of this gpupool version", arbiter_dir, name);
        return -1;
    }
    return 0;
}

/* connected through a descriptor of the directory: a socket path of any length */
static int connect_in(int dir, char *why, size_t size) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s", dir,
             GPUPOOL_ARBITER_SOCKET);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) return fd;
    snprintf(why, size, "%s/%s: %s", arbiter_dir, GPUPOOL_ARBITER_SOCKET, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
}

static int join(gp_arb_dev *d, int dev, char *why, size_t size) {
    __typeof__(&cuDeviceGetUuid) get_uuid = GP_REAL(cuDeviceGetUuid);
    CUuuid uuid;
    if (get_uuid == NULL || get_uuid(&uuid, dev) != CUDA_SUCCESS) {
        snprintf(why, size, "the device has no UUID");
        return -1;
    }
    int dir = open(arbiter_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        snprintf(why, size, "%s: %s", arbiter_dir, strerror(errno));
        return -1;
    }
    d->fd = connect_in(dir, why, size);
    struct ucred cred;
    socklen_t len = sizeof cred;
    int rc = -1;
    if (d->fd >= 0 && getsockopt(d->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        int beat_fd = make_beat(d);
        if (beat_fd < 0) {
            snprintf(why, size, "no memfd for its beat: %s", strerror(errno));
        } else {
            rc = hello(d, &uuid, beat_fd, why, size);
            close(beat_fd);
            /* the view is trusted only as a file of the user the kernel says the arbiter is */
            if (rc == 0) rc = map_view(d, dir, &uuid, cred.uid, why, size);
        }
    }
    close(dir);
    return rc;
}

static gp_arb_dev *join_or_wait(gp_arb_dev *d, int dev, int state);

/* the device's connection once joined: inline, the join out of line (its frame is large) */
static inline gp_arb_dev *ready(int dev) {
    if (dev < 0 || dev >= GP_MAX_DEVICES) return NULL;
    gp_arb_dev *d = &devs[dev];
    int state = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (state == GP_ARB_JOINED) return d;
    if (state == GP_ARB_NONE) return NULL;
    return join_or_wait(d, dev, state);
}

__attribute__((noinline)) static gp_arb_dev *join_or_wait(gp_arb_dev *d, int dev, int state) {
    uint64_t now = gp_now_ns();
    if (state == GP_ARB_LOST && now < __atomic_load_n(&d->retry_at, __ATOMIC_RELAXED)) return NULL;
    pthread_mutex_lock(&d->lock);
    if (d->state != GP_ARB_JOINED) {
        char why[768];
        disconnect(d);
        if (join(d, dev, why, sizeof why) == 0) {
            if (d->said) gp_log(GP_LOG_INFO, "the compute arbiter is back: GPU %d arbitrated", dev);
            d->said = 0;
            d->checked_at = now;
            __atomic_store_n(&d->state, GP_ARB_JOINED, __ATOMIC_RELEASE);
        } else {
            disconnect(d);
            if (!d->said++)
                gp_log(GP_LOG_WARN,
                       "no compute arbiter for GPU %d (%s): the share holds its compute cap alone "
                       "until it is back",
                       dev, why);
            d->retry_at = now + GP_RETRY_NS;
            __atomic_store_n(&d->state, GP_ARB_LOST, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&d->lock);
    return d->state == GP_ARB_JOINED ? d : NULL;
}

/* under d->lock: the arbiter is gone; hold the cap alone and try again later */
static void lost(gp_arb_dev *d, int dev) {
    disconnect(d);
    if (!d->said++)
        gp_log(GP_LOG_WARN,
               "the compute arbiter of GPU %d went away: the share holds its compute cap alone "
               "until it is back",
               dev);
    d->retry_at = gp_now_ns() + GP_RETRY_NS;
    __atomic_store_n(&d->state, GP_ARB_LOST, __ATOMIC_RELEASE);
}

int gp_arbiter_active(int dev, uint64_t now) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return 0;
    /* a holder never waits on the socket: look now and then whether the arbiter is still there */
    if (now < d->checked_at + GP_CHECK_NS) return 1;
    pthread_mutex_lock(&d->lock);
    d->checked_at = now;
    char byte;
    if (d->state == GP_ARB_JOINED && recv(d->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
        lost(d, dev);
    int joined = d->state == GP_ARB_JOINED;
    pthread_mutex_unlock(&d->lock);
    return joined;
}

static int holds(const gp_arb_dev *d) {
    return d->lease != 0 && __atomic_load_n(&d->view->lease, __ATOMIC_ACQUIRE) == d->lease;
}

void gp_arbiter_acquire(int dev) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    pthread_mutex_lock(&d->lock);
    if (d->state != GP_ARB_JOINED || holds(d)) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    uint64_t since = gp_now_ns();
    gpupool_arbiter_msg m;
    d->lease = 0;
    d->resting = 0;
    if (send_msg(d, GPUPOOL_ARB_ACQUIRE, 0) != 0 || recv_msg(d, &m) != 0 ||
        m.kind != GPUPOOL_ARB_GRANT) {
        lost(d, dev);
    } else {
        d->lease = m.value;
        uint64_t now = gp_now_ns();
        /* the share's time held back for the lease */
        if (now - since > 20000) gp_region_count_wait(dev, GP_WAIT_LEASE, now - since);
    }
    pthread_mutex_unlock(&d->lock);
}

int gp_arbiter_should_yield(int dev, uint64_t now) {
    (void)now;
    gp_arb_dev *d = ready(dev);
    if (d == NULL || d->lease == 0) return 0;
    const gpupool_arbiter_view *v = d->view;
    uint64_t current = __atomic_load_n(&v->lease, __ATOMIC_ACQUIRE);
    /* asked back, or taken already: either way its work drains before it asks again */
    return current != d->lease || __atomic_load_n(&v->yield_lease, __ATOMIC_RELAXED) == d->lease;
}

int gp_arbiter_high_active(int dev, uint64_t now) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return 0;
    for (int i = 0; i < GPUPOOL_ARBITER_SHARES; i++) {
        const gpupool_arbiter_share *o = &d->view->share[i];
        if (i == d->slot || o->share_id == 0 || o->priority == GP_PRIORITY_LOW) continue;
        if (__atomic_load_n(&o->resting, __ATOMIC_RELAXED)) continue;
        if (__atomic_load_n(&o->wanted_ns, __ATOMIC_RELAXED) + GP_IDLE_NS >= now) return 1;
    }
    return 0;
}

int gp_arbiter_holds(int dev) {
    gp_arb_dev *d = ready(dev);
    return d != NULL && holds(d);
}

void gp_arbiter_release(int dev) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    pthread_mutex_lock(&d->lock);
    if (d->state == GP_ARB_JOINED && holds(d) && send_msg(d, GPUPOOL_ARB_RELEASE, d->lease) != 0)
        lost(d, dev);
    d->lease = 0;
    pthread_mutex_unlock(&d->lock);
}

/* A share asleep for its cap has work it may not run yet: it says so once, so that a low share
 * does not keep its batches small for a high share that is only sleeping */
void gp_arbiter_rest(int dev, uint64_t now) {
    (void)now;
    gp_arb_dev *d = ready(dev);
    if (d == NULL || d->resting) return;
    pthread_mutex_lock(&d->lock);
    d->resting = 1;
    if (d->state == GP_ARB_JOINED && send_msg(d, GPUPOOL_ARB_REST, 0) != 0) lost(d, dev);
    pthread_mutex_unlock(&d->lock);
}

/* a batch opens: when, and how long its queued work may keep the GPU busy */
void gp_arbiter_batch(int dev, uint64_t now, uint64_t estimate_ns) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    gpupool_arbiter_beat *b = d->beat;
    uint64_t until = __atomic_load_n(&b->busy_until_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&b->busy_until_ns, (until > now ? until : now) + estimate_ns,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&b->last_launch_ns, now, __ATOMIC_RELAXED);
}

/* a launch in the open batch, under the throttle's lock (one writer a device): the lease still
 * ours and not asked back, as the view says (two loads, no clock); 0 closes the batch */
int gp_arbiter_launch_ok(int dev) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return 1;
    const gpupool_arbiter_view *v = d->view;
    return d->lease != 0 && __atomic_load_n(&v->lease, __ATOMIC_ACQUIRE) == d->lease &&
           __atomic_load_n(&v->yield_lease, __ATOMIC_RELAXED) != d->lease;
}

/* counted in the beat, not timed: the arbiter sees the count move */
void gp_arbiter_launched(int dev) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    gpupool_arbiter_beat *b = d->beat;
    __atomic_store_n(&b->launches, __atomic_load_n(&b->launches, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
}

/* at exit: a lease this process holds goes back at once, not when the arbiter sees it quiet */
void gp_arbiter_close(void) {
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        if (__atomic_load_n(&devs[dev].state, __ATOMIC_ACQUIRE) == GP_ARB_JOINED)
            gp_arbiter_release(dev);
    }
}

/* the child shares its parent's connections and beat pages: it makes its own */
void gp_arbiter_after_fork(void) {
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        gp_arb_dev *d = &devs[dev];
        pthread_mutex_init(&d->lock, NULL);
        if (d->state == GP_ARB_NONE) continue;
        disconnect(d);
        d->state = GP_ARB_UNKNOWN;
        d->said = 0;
        d->resting = 0;
    }
}
