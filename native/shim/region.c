/*
 * The shared region: one file per share (GPUPOOL_SHARED_REGION) mapped by every process of the
 * share. It fixes the share's limits (the first process writes them; later ones, children
 * included, read them and cannot loosen them through their environment) and counts the bytes each
 * live process holds per device, under a robust process-shared mutex. A process that dies without
 * freeing is found by its pid and start time and its bytes are given back. It also counts, per
 * device, what the daemon exports per job: allocations refused and time launches were held back.
 * The layout is in native/include/gpupool_region.h (Python reads it).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpupool_pidstat.h"
#include "gpupool_region.h"
#include "shim.h"

#define GP_REGION_MAGIC GPUPOOL_REGION_MAGIC
#define GP_REGION_VERSION GPUPOOL_REGION_VERSION
#define GP_REGION_PROCS GPUPOOL_REGION_PROCS
#define GP_SPANS GPUPOOL_REGION_SPANS

_Static_assert(GPUPOOL_REGION_DEVICES == GP_MAX_DEVICES, "the region counts every device");

typedef gpupool_region_proc gp_region_proc;
typedef gpupool_region_span gp_span;
typedef gpupool_region gp_region;

static gp_region *region;
static int my_slot = -1; /* claimed at the first reservation */
static pid_t my_pid;

static int proc_alive(const gp_region_proc *proc) {
    if (proc->pid <= 0) return 0;
    if (kill(proc->pid, 0) != 0 && errno == ESRCH) return 0;
    return gpupool_start_time(proc->pid) == proc->start_time;
}

/* drops dead processes' slots; with `recount`, rebuilds the totals from the live slots (after a
 * process died inside the critical section, the totals may be half-updated) */
static void reclaim_dead(int recount) {
    for (int i = 0; i < GP_REGION_PROCS; i++) {
        gp_region_proc *proc = &region->procs[i];
        if (proc->pid == 0 || proc->pid == my_pid || proc_alive(proc)) continue;
        for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
            if (proc->used[dev] == 0) continue;
            gp_log(GP_LOG_INFO, "gave back %llu bytes on device %d of dead process %d",
                   (unsigned long long)proc->used[dev], dev, proc->pid);
            region->used[dev] -=
                proc->used[dev] < region->used[dev] ? proc->used[dev] : region->used[dev];
        }
        memset(proc, 0, sizeof *proc);
    }
    if (!recount) return;
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        uint64_t sum = 0;
        for (int i = 0; i < GP_REGION_PROCS; i++) sum += region->procs[i].used[dev];
        region->used[dev] = sum;
    }
}

static void region_lock(void) {
    int rc = pthread_mutex_lock(&region->lock.mutex);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&region->lock.mutex);
        gp_log(GP_LOG_INFO, "a process of this share died holding its lock; recounting");
        reclaim_dead(1);
    } else if (rc != 0) {
        gp_fatal("the shared region's lock is unusable (%s)", strerror(rc));
    }
}

static void region_unlock(void) { pthread_mutex_unlock(&region->lock.mutex); }

static void init_mutex(pthread_mutex_t *mutex) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(mutex, &attr);
    pthread_mutexattr_destroy(&attr);
}

static void init_region(gp_region *r, const gp_config *cfg) {
    memset(r, 0, sizeof *r);
    r->version = GP_REGION_VERSION;
    r->size = sizeof *r;
    if (getrandom(&r->share_id, sizeof r->share_id, 0) != (ssize_t)sizeof r->share_id)
        r->share_id = gp_now_ns() ^ ((uint64_t)getpid() << 32);
    r->policy = (uint32_t)cfg->policy;
    memcpy(r->memory_limit, cfg->memory_limit, sizeof r->memory_limit);
    memcpy(r->compute_limit, cfg->compute_limit, sizeof r->compute_limit);
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) r->elastic.burst_limit[dev] = cfg->memory_burst;
    init_mutex(&r->lock.mutex);
    __atomic_store_n(&r->magic, GP_REGION_MAGIC, __ATOMIC_RELEASE);
}

static gp_region *map_private(const gp_config *cfg) {
    void *mem =
        mmap(NULL, sizeof(gp_region), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) gp_fatal("cannot map accounting memory: %s", strerror(errno));
    init_region(mem, cfg);
    return mem;
}

static void warn_if_env_differs(const gp_region *r, const gp_config *cfg) {
    if (memcmp(r->memory_limit, cfg->memory_limit, sizeof r->memory_limit) != 0 ||
        memcmp(r->compute_limit, cfg->compute_limit, sizeof r->compute_limit) != 0 ||
        r->policy != (uint32_t)cfg->policy) {
        gp_log(GP_LOG_INFO, "this share's limits were fixed by its first process; "
                            "the GPUPOOL_* values of this process are ignored");
    }
}

static gp_region *map_shared(const gp_config *cfg) {
    const char *path = cfg->region_path;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        gp_fatal("cannot open the shared region GPUPOOL_SHARED_REGION=%s: %s", path,
                 strerror(errno));
    /* the first process to hold the file lock initialises; the others wait and map */
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) gp_fatal("cannot lock the shared region %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        gp_fatal("cannot stat the shared region %s: %s", path, strerror(errno));
    if (st.st_size != 0 && st.st_size != (off_t)sizeof(gp_region))
        gp_fatal("%s is not a gpupool shared region (size %lld, expected %zu)", path,
                 (long long)st.st_size, sizeof(gp_region));
    if (st.st_size == 0 && ftruncate(fd, sizeof(gp_region)) != 0)
        gp_fatal("cannot size the shared region %s: %s", path, strerror(errno));
    void *mem = mmap(NULL, sizeof(gp_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) gp_fatal("cannot map the shared region %s: %s", path, strerror(errno));
    gp_region *r = mem;
    uint64_t magic = __atomic_load_n(&r->magic, __ATOMIC_ACQUIRE);
    if (magic == 0) {
        init_region(r, cfg);
    } else if (magic != GP_REGION_MAGIC || r->version != GP_REGION_VERSION) {
        gp_fatal("%s is not a gpupool shared region of this version", path);
    } else {
        warn_if_env_differs(r, cfg);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return r;
}

/* a slot of this very process (same pid and start time) is from before an exec: its
 * allocations went with the old image */
static void drop_previous_image(void) {
    uint64_t start = gpupool_start_time(my_pid);
    for (int i = 0; i < GP_REGION_PROCS; i++) {
        gp_region_proc *proc = &region->procs[i];
        if (proc->pid != my_pid || proc->start_time != start) continue;
        for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
            region->used[dev] -=
                proc->used[dev] < region->used[dev] ? proc->used[dev] : region->used[dev];
        }
        memset(proc, 0, sizeof *proc);
    }
}

void gp_region_open(const gp_config *cfg) {
    my_pid = getpid();
    region = cfg->region_path ? map_shared(cfg) : map_private(cfg);
    if (cfg->region_path) {
        region_lock();
        reclaim_dead(0);
        drop_previous_image();
        region_unlock();
    }
}

/* a child process starts with no slot of its own and no allocations */
void gp_region_after_fork(void) {
    my_slot = -1;
    my_pid = getpid();
}

static int claim_slot(void) {
    uint64_t start = gpupool_start_time(my_pid);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < GP_REGION_PROCS; i++) {
            gp_region_proc *proc = &region->procs[i];
            if (proc->pid != 0) continue;
            memset(proc, 0, sizeof *proc);
            proc->pid = my_pid;
            proc->start_time = start;
            /* a process that starts while its share runs has carried out the daemon's request */
            gpupool_region_elastic *e = &region->elastic;
            uint32_t running = __atomic_load_n(&e->control, __ATOMIC_ACQUIRE) == GP_ELASTIC_RUN;
            e->ack_state[i] = GP_ACK_RUNNING;
            __atomic_store_n(&e->ack_seq[i], running ? e->control_seq : 0, __ATOMIC_RELEASE);
            return i;
        }
        reclaim_dead(0);
    }
    gp_fatal("the share's process table is full (%d live processes)", GP_REGION_PROCS);
}

int gp_region_reserve(int dev, uint64_t bytes, uint64_t limit, uint64_t *used_out) {
    if (region == NULL) return 0; /* called before the constructor ran: nothing to count yet */
    region_lock();
    if (my_slot < 0) my_slot = claim_slot();
    if (limit != 0 && (region->used[dev] > limit || bytes > limit - region->used[dev])) {
        /* maybe a process of the share died: take its bytes back before saying no */
        reclaim_dead(0);
        if (region->used[dev] > limit || bytes > limit - region->used[dev]) {
            *used_out = region->used[dev];
            region_unlock();
            return -1;
        }
    }
    region->procs[my_slot].used[dev] += bytes;
    region->used[dev] += bytes;
    region_unlock();
    return 0;
}

void gp_region_release(int dev, uint64_t bytes) {
    if (region == NULL) return;
    region_lock();
    if (my_slot >= 0) {
        uint64_t *mine = &region->procs[my_slot].used[dev];
        if (bytes > *mine) bytes = *mine;
        *mine -= bytes;
        region->used[dev] -= bytes < region->used[dev] ? bytes : region->used[dev];
    }
    region_unlock();
}

/* at exit: what this process held is freed with it */
void gp_region_close(void) {
    if (region == NULL || my_slot < 0 || getpid() != my_pid) return;
    region_lock();
    gp_region_proc *proc = &region->procs[my_slot];
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        region->used[dev] -=
            proc->used[dev] < region->used[dev] ? proc->used[dev] : region->used[dev];
    }
    memset(proc, 0, sizeof *proc);
    my_slot = -1;
    region_unlock();
}

gpupool_region_elastic *gp_region_elastic(void) { return region ? &region->elastic : NULL; }
int gp_region_slot(void) { return my_slot; }

/* a burst allocation: `bytes` more of the share's burst on `dev`, if it has them */
int gp_region_burst_reserve(int dev, uint64_t bytes) {
    if (region == NULL) return -1;
    region_lock();
    gpupool_region_elastic *e = &region->elastic;
    int ok = e->burst_used[dev] <= e->burst_limit[dev] &&
             bytes <= e->burst_limit[dev] - e->burst_used[dev];
    if (ok) e->burst_used[dev] += bytes;
    region_unlock();
    return ok ? 0 : -1;
}

void gp_region_burst_release(int dev, uint64_t bytes) {
    if (region == NULL) return;
    region_lock();
    uint64_t *used = &region->elastic.burst_used[dev];
    *used -= bytes < *used ? bytes : *used;
    region_unlock();
}

uint64_t gp_region_used(int dev) {
    return region ? __atomic_load_n(&region->used[dev], __ATOMIC_RELAXED) : 0;
}
uint64_t gp_region_memory_limit(int dev) { return region ? region->memory_limit[dev] : 0; }
uint32_t gp_region_compute_limit(int dev) { return region ? region->compute_limit[dev] : 100; }
gp_policy gp_region_policy(void) { return (gp_policy)region->policy; }
uint64_t gp_region_share_id(void) { return region->share_id; }

int gp_region_any_compute_limit(void) {
    if (region == NULL) return 0;
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        if (region->compute_limit[dev] < 100) return 1;
    }
    return 0;
}

/* the part of [start, end) that no process of the share has paid for yet, recorded as paid.
 * Two processes of one share measure their own batches, but a batch that waited behind a sibling's
 * kernel would also count the sibling's time: the union of what was paid removes the overlap. */
static uint64_t unpaid_part(gp_span *spans, uint64_t start, uint64_t end) {
    if (end <= start) return 0;
    uint64_t overlap = 0, merged_start = start, merged_end = end;
    for (int i = 0; i < GP_SPANS; i++) {
        gp_span *span = &spans[i];
        if (span->end == 0 || span->end < start || span->start > end) continue;
        uint64_t lo = span->start > start ? span->start : start;
        uint64_t hi = span->end < end ? span->end : end;
        if (hi > lo) overlap += hi - lo;
        if (span->start < merged_start) merged_start = span->start;
        if (span->end > merged_end) merged_end = span->end;
        span->end = 0; /* merged into the new span */
    }
    int slot = 0;
    for (int i = 0; i < GP_SPANS; i++) {
        if (spans[i].end == 0) {
            slot = i;
            break;
        }
        if (spans[i].end < spans[slot].end) slot = i; /* full: forget the oldest */
    }
    spans[slot] = (gp_span){merged_start, merged_end};
    return end - start - overlap;
}

int64_t gp_region_credit(int dev, uint32_t percent, uint64_t now, int64_t cap_ns,
                         uint64_t busy_start, uint64_t busy_end) {
    if (region == NULL) return 0;
    region_lock();
    int64_t *credit = &region->credit_ns[dev];
    uint64_t *at = &region->credit_at_ns[dev];
    /* a clock read by another process just before ours may be later: then nothing to add */
    if (*at != 0 && now > *at) *credit += (int64_t)((now - *at) * percent / 100);
    if (now > *at) *at = now;
    if (*credit > cap_ns) *credit = cap_ns;
    *credit -= (int64_t)unpaid_part(region->spans[dev], busy_start, busy_end);
    int64_t left = *credit;
    region_unlock();
    return left;
}

/* one relaxed add each, no lock: the launch path pays nothing more than that, and only when it
 * was refused or waited */
void gp_region_count_refusal(int dev) {
    if (region != NULL) __atomic_add_fetch(&region->counters[dev].refused, 1, __ATOMIC_RELAXED);
}

void gp_region_count_wait(int dev, gp_wait_reason reason, uint64_t ns) {
    if (region == NULL || ns == 0) return;
    uint64_t *total = reason == GP_WAIT_CAP ? &region->counters[dev].cap_wait_ns
                                            : &region->counters[dev].lease_wait_ns;
    __atomic_add_fetch(total, ns, __ATOMIC_RELAXED);
}
