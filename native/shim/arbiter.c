/*
 * The compute arbiter: one node-wide file per physical GPU (named by its UUID), shared by every
 * share with a compute limit on that GPU, so that only one process at a time has work in flight.
 *
 * A process launches only while it holds the GPU's lease. It gives the lease back after
 * GP_LEASE_NS when another share wants the GPU (after waiting for its own work to finish, so the
 * GPU time each share's events measure is its own, never the other shares' time-sliced in), or
 * when it must sleep for its cap. A free lease goes to the wanting share whose virtual clock is
 * earliest; a share's clock advances by its measured GPU time over its weight (its percent), so
 * busy shares split the GPU by weight. A share that has not wanted the GPU for GP_IDLE_NS starts
 * again at the earliest clock of the others: idle time is never banked. A holder that stopped
 * launching (and whose work should be over), or whose process is gone, loses the lease.
 *
 * Priorities: a `low` share takes the lease only while no `high` share wants it; a high share
 * that asks takes the lease from a low holder at once (the low one finds it gone at its next
 * batch; next to an active high share its batches are small, about GP_BATCH_NS, and one at a
 * time, so a high request waits for at most that, and for one low kernel: kernels are not
 * preempted). A high share wants the GPU only while it asks at every batch (within
 * GP_HIGH_WANT_NS), and a high holder whose work is done lets a waiting low share in after
 * GP_HIGH_HOLD_IDLE_NS: a latency-bound service's gaps between requests go to the low shares
 * instead of idling. A high share never yields to a low one.
 *
 * A file that is not an arbiter of this version stops the workload (exit 2): it never runs
 * unarbitrated by mistake.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gpupool_arbiter.h"
#include "shim.h"

#define GP_ARB_SHARES GPUPOOL_ARBITER_SHARES
#define GP_LEASE_NS (20 * GP_NS_PER_MS)
#define GP_WANT_NS (3 * GP_NS_PER_MS) /* a share that asked this recently still wants the GPU */
/* a high share asks at every slice while it has work: one that has not asked for this long is
 * between requests, and the low shares may use the GPU */
#define GP_HIGH_WANT_NS (800 * 1000ULL)
#define GP_HOLD_IDLE_NS (3 * GP_NS_PER_MS)   /* a holder this long without launching lets go */
#define GP_HIGH_HOLD_IDLE_NS (500 * 1000ULL) /* a high holder, when a low share waits */
#define GP_IDLE_NS (50 * GP_NS_PER_MS)       /* a share idle this long starts afresh */
#define GP_STALE_NS (10 * GP_NS_PER_S)       /* a share slot this old may be reused */
#define GP_POLL_NS (200 * 1000ULL)

typedef gpupool_arbiter_share gp_arb_share;
typedef gpupool_arbiter_file gp_arb_file;

typedef struct {
    int state; /* 0 unknown, 1 ready, -1 none */
    gp_arb_file *file;
    int slot;
} gp_arb_dev;

static const char *arbiter_dir;
static gp_priority priority;
static pthread_mutex_t local_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_arb_dev devs[GP_MAX_DEVICES];
static uint64_t my_start;
/* getpid() is a system call (glibc no longer caches it) and the lease checks ask at every batch */
static pid_t my_pid;

void gp_arbiter_configure(const char *dir, gp_priority chosen) {
    arbiter_dir = dir;
    priority = chosen;
}

gp_priority gp_arbiter_priority(void) { return priority; }

static int is_low(const gp_arb_share *s) { return s->priority == GP_PRIORITY_LOW; }

static int wants(const gp_arb_share *s, uint64_t now) {
    uint64_t window = s->priority == GP_PRIORITY_HIGH ? GP_HIGH_WANT_NS : GP_WANT_NS;
    return s->share_id != 0 && s->wanted_ns + window >= now;
}

static void init_file(gp_arb_file *map) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&map->lock.mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    map->version = GPUPOOL_ARBITER_VERSION;
    map->size = sizeof *map;
    __atomic_store_n(&map->magic, GPUPOOL_ARBITER_MAGIC, __ATOMIC_RELEASE);
}

static gp_arb_file *map_file(const char *path) {
    /* every user's shares on the GPU share its arbiter: readable and writable by all */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) gp_fatal("cannot open the compute arbiter %s: %s", path, strerror(errno));
    struct stat st;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0)
        gp_fatal("cannot lock the compute arbiter %s: %s", path, strerror(errno));
    int fresh = st.st_size == 0;
    /* a file the daemon made for every user is 0666 already, and only its owner may chmod it */
    int open_to_all = (st.st_mode & 0666) == 0666;
    if (fresh &&
        ((!open_to_all && fchmod(fd, 0666) != 0) || ftruncate(fd, sizeof(gp_arb_file)) != 0))
        gp_fatal("cannot size the compute arbiter %s: %s", path, strerror(errno));
    if (!fresh && st.st_size != (off_t)sizeof(gp_arb_file))
        gp_fatal("%s is not a compute arbiter of this gpupool version: remove it when no "
                 "workload runs on this GPU",
                 path);
    void *mem = mmap(NULL, sizeof(gp_arb_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) gp_fatal("cannot map the compute arbiter %s: %s", path, strerror(errno));
    gp_arb_file *map = mem;
    if (fresh) {
        init_file(map);
    } else if (map->magic != GPUPOOL_ARBITER_MAGIC || map->version != GPUPOOL_ARBITER_VERSION ||
               map->size != sizeof *map) {
        gp_fatal("%s is not a compute arbiter of this gpupool version: remove it when no "
                 "workload runs on this GPU",
                 path);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return map;
}

static gp_arb_dev *ready(int dev) {
    if (arbiter_dir == NULL || dev < 0 || dev >= GP_MAX_DEVICES) return NULL;
    gp_arb_dev *d = &devs[dev];
    int state = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (state != 0) return state > 0 ? d : NULL;
    pthread_mutex_lock(&local_lock);
    if (d->state == 0) {
        __typeof__(&cuDeviceGetUuid) get_uuid = GP_REAL(cuDeviceGetUuid);
        CUuuid uuid;
        if (get_uuid != NULL && get_uuid(&uuid, dev) == CUDA_SUCCESS) {
            char path[640];
            int n = snprintf(path, sizeof path, "%s/gpupool-arbiter-", arbiter_dir);
            for (int i = 0; i < 16 && n > 0 && (size_t)n + 3 < sizeof path; i++)
                n += snprintf(path + n, sizeof path - (size_t)n, "%02x",
                              (unsigned char)uuid.bytes[i]);
            d->file = map_file(path);
            d->slot = -1;
            if (my_start == 0) {
                my_pid = getpid();
                my_start = gp_proc_start_time(my_pid);
            }
        }
        __atomic_store_n(&d->state, d->file != NULL ? 1 : -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&local_lock);
    return d->state > 0 ? d : NULL;
}

/* Waiting shares sleep on the file's turn (a futex shared by every process mapping it) and are
 * woken when a share lets the lease go or stops wanting it: the next share runs at once instead of
 * at its next poll, which cost the GPU up to GP_POLL_NS at every hand-over. What only time changes
 * (a holder gone quiet, a high share no longer asking) is still found by the poll. */
static void wait_turn(gp_arb_file *f, uint32_t seen) {
    struct timespec timeout = {.tv_sec = 0, .tv_nsec = (long)GP_POLL_NS};
    if (syscall(SYS_futex, &f->turn, FUTEX_WAIT, seen, &timeout, NULL, 0) == 0) return;
    /* the turn moved (EAGAIN), the poll is due (ETIMEDOUT) or a signal came: look again; any
     * other failure (a kernel or sandbox without futexes) must not turn the wait into a spin */
    if (errno != EAGAIN && errno != ETIMEDOUT && errno != EINTR) gp_sleep_ns(GP_POLL_NS);
}

/* under the lock */
static void pass_turn(gp_arb_file *f) {
    __atomic_add_fetch(&f->turn, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &f->turn, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void lock(gp_arb_file *f) {
    if (pthread_mutex_lock(&f->lock.mutex) == EOWNERDEAD)
        pthread_mutex_consistent(&f->lock.mutex); /* fields are written whole: still valid */
}

static int holder_gone(const gp_arb_file *f) {
    if (f->holder_pid == 0) return 1;
    if (kill(f->holder_pid, 0) != 0 && errno == ESRCH) return 1;
    return gp_proc_start_time(f->holder_pid) != f->holder_start;
}

/* the earliest clock of the shares that want the GPU, other than `self` (UINT64_MAX: none) */
static uint64_t floor_vtime(const gp_arb_file *f, int self, uint64_t now) {
    uint64_t low = UINT64_MAX;
    for (int i = 0; i < GP_ARB_SHARES; i++) {
        const gp_arb_share *s = &f->share[i];
        if (i == self || s->share_id == 0 || s->wanted_ns + GP_IDLE_NS < now) continue;
        if (s->vtime < low) low = s->vtime;
    }
    return low;
}

static int claim_slot(gp_arb_dev *d, uint64_t share, uint64_t now) {
    gp_arb_file *f = d->file;
    if (d->slot >= 0 && f->share[d->slot].share_id == share) return d->slot;
    int spare = -1;
    for (int i = 0; i < GP_ARB_SHARES; i++) {
        if (f->share[i].share_id == share) return d->slot = i;
        if (spare < 0 && (f->share[i].share_id == 0 || f->share[i].wanted_ns + GP_STALE_NS < now))
            spare = i;
    }
    if (spare < 0) gp_fatal("more than %d compute shares on one GPU", GP_ARB_SHARES);
    uint64_t low = floor_vtime(f, spare, now);
    f->share[spare] = (gp_arb_share){.share_id = share, .vtime = low == UINT64_MAX ? 0 : low};
    return d->slot = spare;
}

/* under the lock: whether this process may take the lease now */
static int try_take(gp_arb_dev *d, uint32_t weight, uint64_t now) {
    gp_arb_file *f = d->file;
    int me = claim_slot(d, gp_region_share_id(), now);
    gp_arb_share *s = &f->share[me];
    if (s->wanted_ns + GP_IDLE_NS < now) {
        uint64_t low = floor_vtime(f, me, now);
        if (low != UINT64_MAX && low > s->vtime) s->vtime = low;
    }
    s->wanted_ns = now;
    s->weight = weight;
    s->priority = priority;
    s->policy = (uint32_t)gp_region_policy();
    s->pid = my_pid;
    if (f->holder_pid == my_pid) return 1;
    const gp_arb_share *holder = &f->share[f->holder_slot % GP_ARB_SHARES];
    /* a high share takes the GPU from a low holder at once: the low one finds it gone at its
     * next slice, and what it has in flight then is one small slice */
    int preempt = priority == GP_PRIORITY_HIGH && is_low(holder);
    /* a high holder between requests lets a waiting low share in soon: its work is done */
    uint64_t hold_idle =
        holder->priority == GP_PRIORITY_HIGH && is_low(s) ? GP_HIGH_HOLD_IDLE_NS : GP_HOLD_IDLE_NS;
    int idle = now > f->last_launch_ns + hold_idle && now > f->busy_until_ns;
    if (!holder_gone(f) && !idle && !preempt) return 0;
    for (int i = 0; i < GP_ARB_SHARES; i++) {
        const gp_arb_share *o = &f->share[i];
        if (i == me || !wants(o, now)) continue;
        /* a high share goes first; within a class, the earliest clock */
        if (is_low(o) < is_low(s) || (is_low(o) == is_low(s) && o->vtime < s->vtime)) return 0;
    }
    f->holder_pid = my_pid;
    f->holder_start = my_start;
    f->holder_slot = (uint32_t)me;
    f->granted_ns = f->last_launch_ns = f->busy_until_ns = now;
    return 1;
}

int gp_arbiter_active(int dev) { return ready(dev) != NULL; }

void gp_arbiter_acquire(int dev, uint32_t weight) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    uint64_t waiting_since = 0;
    for (;;) {
        uint64_t now = gp_now_ns();
        lock(d->file);
        uint32_t turn = __atomic_load_n(&d->file->turn, __ATOMIC_ACQUIRE);
        int taken = try_take(d, weight, now);
        pthread_mutex_unlock(&d->file->lock.mutex);
        if (taken) {
            /* the share's time held back for the lease (counted once, when it ends) */
            if (waiting_since != 0) gp_region_count_wait(dev, GP_WAIT_LEASE, now - waiting_since);
            return;
        }
        if (waiting_since == 0) waiting_since = now;
        wait_turn(d->file, turn);
    }
}

int gp_arbiter_should_yield(int dev, uint64_t now) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return 0;
    gp_arb_file *f = d->file;
    if (__atomic_load_n(&f->holder_pid, __ATOMIC_RELAXED) != my_pid) return 0;
    int low = priority == GP_PRIORITY_LOW;
    int expired = now >= __atomic_load_n(&f->granted_ns, __ATOMIC_RELAXED) + GP_LEASE_NS;
    /* only a low holder yields before its lease is up: the others need not look (this runs at
     * every batch of a busy share) */
    if (!expired && !low) return 0;
    for (int i = 0; i < GP_ARB_SHARES; i++) {
        const gp_arb_share *o = &f->share[i];
        if (i == d->slot || !wants(o, now)) continue;
        /* a low holder yields to a high share at once; nobody yields to a low one */
        if (low && !is_low(o)) return 1;
        if (expired && is_low(o) == low) return 1;
    }
    return 0;
}

int gp_arbiter_high_active(int dev, uint64_t now) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return 0;
    for (int i = 0; i < GP_ARB_SHARES; i++) {
        const gp_arb_share *o = &d->file->share[i];
        if (i == d->slot || o->share_id == 0 || is_low(o)) continue;
        if (__atomic_load_n(&o->wanted_ns, __ATOMIC_RELAXED) + GP_IDLE_NS >= now) return 1;
    }
    return 0;
}

int gp_arbiter_holds(int dev) {
    gp_arb_dev *d = ready(dev);
    return d != NULL && __atomic_load_n(&d->file->holder_pid, __ATOMIC_RELAXED) == my_pid;
}

void gp_arbiter_release(int dev) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    lock(d->file);
    if (d->file->holder_pid == my_pid) {
        d->file->holder_pid = 0;
        pass_turn(d->file);
    }
    pthread_mutex_unlock(&d->file->lock.mutex);
}

/* A share asleep for its cap has work it may not run yet: it stops wanting the GPU until it asks
 * again, so that the others, a low share too, use the time it leaves (without this, a low share
 * next to a capped share with no priority waited out the want window after its every batch) */
void gp_arbiter_rest(int dev, uint64_t now) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL || d->slot < 0 || now <= GP_WANT_NS) return;
    lock(d->file);
    gp_arb_share *s = &d->file->share[d->slot];
    /* just outside every want window, and far from the idle and stale limits */
    if (s->share_id == gp_region_share_id() && s->wanted_ns >= now - GP_WANT_NS) {
        s->wanted_ns = now - GP_WANT_NS - 1;
        pass_turn(d->file);
    }
    pthread_mutex_unlock(&d->file->lock.mutex);
}

void gp_arbiter_launched(int dev, uint64_t now, uint64_t estimate_ns) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL) return;
    gp_arb_file *f = d->file;
    uint64_t until = __atomic_load_n(&f->busy_until_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&f->busy_until_ns, (until > now ? until : now) + estimate_ns,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&f->last_launch_ns, now, __ATOMIC_RELAXED);
}

void gp_arbiter_charge(int dev, uint64_t busy_ns, uint32_t weight) {
    gp_arb_dev *d = ready(dev);
    if (d == NULL || d->slot < 0 || weight == 0) return;
    lock(d->file);
    gp_arb_share *s = &d->file->share[d->slot];
    if (s->share_id == gp_region_share_id()) {
        s->vtime += busy_ns * 100 / weight;
        s->busy_ns += busy_ns;
    }
    pthread_mutex_unlock(&d->file->lock.mutex);
}

/* at exit: a lease this process holds goes back at once, not after the idle timeout */
void gp_arbiter_close(void) {
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        if (__atomic_load_n(&devs[dev].state, __ATOMIC_ACQUIRE) > 0) gp_arbiter_release(dev);
    }
}

void gp_arbiter_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    local_lock = fresh;
    my_pid = getpid();
    my_start = 0;
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        if (devs[dev].state > 0) my_start = gp_proc_start_time(my_pid);
    }
}
