/*
 * Elastic memory: suspend and resume of a share, and the burst of a low-priority share past its
 * memory limit, carried out in each process of the share as the daemon asks through the region.
 *
 * With GPUPOOL_ELASTIC=1 an allocation (cuMemAlloc) is managed memory: the driver can move it
 * between the GPU and host memory and it keeps its address wherever it lives. Suspending stops
 * launches and allocations at the library (gp_elastic_closed), synchronises the process's
 * contexts, then prefetches every managed allocation to the host (CU_DEVICE_CPU): the GPU
 * memory is freed. Resuming checks that the GPU has room for what this process moved, prefetches
 * it back to its device, and opens the gate again. A launch already past the gate when the
 * suspension began is still correct: a kernel touching managed memory on the host faults its
 * pages back (this is why managed memory and not a copy to a private buffer).
 *
 * A burst allocation (past memory_limit, within burst_limit) is managed memory placed on the GPU
 * only while the daemon's budget for the share's burst on that GPU (burst_device) allows; when the
 * daemon lowers the budget (a high job needs the room), this thread moves burst allocations to the
 * host until the share's burst on the GPU fits it again, and reports it in burst_on_device.
 *
 * One thread per process polls the region every GP_POLL_NS: a process blocked in a host wait
 * or idle is suspended too, and the answer lands in its slot's ack within a poll or two.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define GP_POLL_NS (10 * GP_NS_PER_MS)
/* after closing the gate: a launch that passed it reaches the driver within this */
#define GP_SETTLE_NS (2 * GP_NS_PER_MS)

int gp_elastic_closed;
static int enabled;
static int started;
static int suspended;                  /* the poller's own state */
static uint64_t moved[GP_MAX_DEVICES]; /* bytes this process moved to the host, per device */
static pthread_mutex_t work_lock = PTHREAD_MUTEX_INITIALIZER;

/* this process's burst allocations and where each is (work_lock) */
typedef struct {
    uint64_t ptr, size, ctx;
    int dev, on_device;
} gp_burst;
static gp_burst *bursts;
static size_t burst_count, burst_capacity;

void gp_elastic_configure(const gp_config *cfg) { enabled = cfg->elastic; }
int gp_elastic_enabled(void) { return enabled; }

void gp_elastic_wait(void) {
    while (__atomic_load_n(&gp_elastic_closed, __ATOMIC_ACQUIRE)) gp_sleep_ns(GP_NS_PER_MS);
}

void gp_elastic_gate(void) {
    if (!enabled) return;
    gpupool_region_elastic *e = gp_region_elastic();
    /* asked but not yet carried out: wait for the poller to close and open the gate again */
    while (e != NULL && __atomic_load_n(&e->control, __ATOMIC_ACQUIRE) == GP_ELASTIC_SUSPEND) {
        gp_elastic_start();
        gp_sleep_ns(GP_NS_PER_MS);
    }
    gp_elastic_wait();
}

static int set_context(uint64_t ctx) {
    __typeof__(&cuCtxSetCurrent) set = GP_REAL(cuCtxSetCurrent);
    return set != NULL && set((CUcontext)(uintptr_t)ctx) == CUDA_SUCCESS ? 0 : -1;
}

/* waits for every context that holds an allocation of this process */
static void synchronize(const gp_ptrmap_item *items, size_t n) {
    __typeof__(&cuCtxSynchronize) sync = GP_REAL(cuCtxSynchronize);
    if (sync == NULL) return;
    for (size_t i = 0; i < n; i++) {
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) seen = items[j].ctx == items[i].ctx;
        if (seen || items[i].ctx == 0 || set_context(items[i].ctx) != 0) continue;
        sync();
    }
}

static int prefetch(const gp_ptrmap_item *item, CUdevice to) {
    __typeof__(&cuMemPrefetchAsync) real = GP_REAL(cuMemPrefetchAsync);
    if (real == NULL || set_context(item->ctx) != 0) return -1;
    return real(item->key, item->size, to, NULL) == CUDA_SUCCESS ? 0 : -1;
}

static int movable(const gp_ptrmap_item *item) {
    return (item->kind == GP_KIND_DEVPTR || item->kind == GP_KIND_BURST) && item->ctx != 0;
}

static int prefetch_burst(gp_burst *b, gpupool_region_elastic *e, int to_device) {
    gp_ptrmap_item item = {.key = b->ptr, .ctx = b->ctx, .size = b->size, .dev = b->dev};
    if (prefetch(&item, to_device ? b->dev : CU_DEVICE_CPU) != 0) return -1;
    /* counted where it is once the migration is done: the daemon starts a job on that count */
    __typeof__(&cuCtxSynchronize) sync = GP_REAL(cuCtxSynchronize);
    if (sync != NULL) sync();
    b->on_device = to_device;
    if (to_device) {
        __atomic_add_fetch(&e->burst_on_device[b->dev], b->size, __ATOMIC_RELAXED);
    } else {
        __atomic_sub_fetch(&e->burst_on_device[b->dev], b->size, __ATOMIC_RELAXED);
    }
    return 0;
}

/* the GPU of `b` has `bytes` free (asked of the driver, not the share) */
static int room_for(const gp_burst *b, uint64_t bytes) {
    __typeof__(&cuMemGetInfo_v2) info = GP_REAL(cuMemGetInfo_v2);
    size_t free_bytes = 0, total = 0;
    return info != NULL && set_context(b->ctx) == 0 && info(&free_bytes, &total) == CUDA_SUCCESS &&
           free_bytes >= bytes;
}

/* the share's burst on each GPU within the daemon's budget: past it, to the host (newest first);
 * under it and while running, back to the GPU where it has room */
static void place_bursts(gpupool_region_elastic *e) {
    for (size_t i = burst_count; i-- > 0;) {
        gp_burst *b = &bursts[i];
        uint64_t budget = __atomic_load_n(&e->burst_device[b->dev], __ATOMIC_ACQUIRE);
        uint64_t on = __atomic_load_n(&e->burst_on_device[b->dev], __ATOMIC_ACQUIRE);
        if (b->on_device && (on > budget || suspended)) prefetch_burst(b, e, 0);
    }
    for (size_t i = 0; i < burst_count && !suspended; i++) {
        gp_burst *b = &bursts[i];
        uint64_t budget = __atomic_load_n(&e->burst_device[b->dev], __ATOMIC_ACQUIRE);
        uint64_t on = __atomic_load_n(&e->burst_on_device[b->dev], __ATOMIC_ACQUIRE);
        if (!b->on_device && on + b->size <= budget && room_for(b, b->size))
            prefetch_burst(b, e, 1);
    }
}

/* a burst allocation on the GPU, tracked (work_lock held); -1 when out of host memory (it then
 * stays where the driver put it) */
static int track_burst(gpupool_region_elastic *e, uint64_t ptr, uint64_t size, int dev,
                       uint64_t ctx) {
    if (burst_count == burst_capacity) {
        size_t grown = burst_capacity ? burst_capacity * 2 : 16;
        gp_burst *more = realloc(bursts, grown * sizeof *more);
        if (more == NULL) return -1;
        bursts = more;
        burst_capacity = grown;
    }
    gp_burst *b = &bursts[burst_count++];
    *b = (gp_burst){.ptr = ptr, .size = size, .ctx = ctx, .dev = dev, .on_device = 1};
    __atomic_add_fetch(&e->burst_on_device[dev], size, __ATOMIC_RELAXED);
    return 0;
}

void gp_elastic_placed_burst(uint64_t ptr, uint64_t size, int dev, uint64_t ctx) {
    gpupool_region_elastic *e = gp_region_elastic();
    pthread_mutex_lock(&work_lock);
    /* the driver put it on the GPU if it had room: count it there, then let the budget decide */
    if (track_burst(e, ptr, size, dev, ctx) == 0) place_bursts(e);
    pthread_mutex_unlock(&work_lock);
}

static int is_managed(const gp_ptrmap_item *item) {
    __typeof__(&cuPointerGetAttribute) get = GP_REAL(cuPointerGetAttribute);
    unsigned int managed = 0;
    return get != NULL && set_context(item->ctx) == 0 &&
           get(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, item->key) == CUDA_SUCCESS && managed;
}

/* A share resized below what it holds, with a burst: this process's managed allocations move
 * from the share into the burst (host-backed past the daemon's budget) until the share's use is
 * within its new limit again, or the burst is full (work_lock held). */
static void spill(gpupool_region_elastic *e) {
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        uint64_t limit = gp_region_memory_limit(dev);
        if (limit == 0 || gp_region_used(dev) <= limit ||
            __atomic_load_n(&e->burst_used[dev], __ATOMIC_RELAXED) >= e->burst_limit[dev])
            continue;
        size_t n = 0;
        gp_ptrmap_item *items = gp_ptrmap_snapshot(&n);
        for (size_t i = 0; i < n && gp_region_used(dev) > limit; i++) {
            gp_ptrmap_item *item = &items[i];
            if (item->dev != dev || item->kind != GP_KIND_DEVPTR || !is_managed(item)) continue;
            if (gp_region_burst_reserve(dev, item->size) != 0) break;
            int owner = -1;
            uint64_t size = 0, ctx = 0;
            if (gp_ptrmap_take(item->key, GP_KIND_DEVPTR, &owner, &size, &ctx) != 0) {
                gp_region_burst_release(dev, item->size); /* freed meanwhile */
                continue;
            }
            gp_ptrmap_put(item->key, GP_KIND_BURST, dev, size, ctx);
            gp_region_release(dev, size);
            track_burst(e, item->key, size, dev, ctx);
        }
        free(items);
    }
}

void gp_elastic_burst_freed(uint64_t ptr, uint64_t size, int dev) {
    gpupool_region_elastic *e = gp_region_elastic();
    gp_region_burst_release(dev, size);
    pthread_mutex_lock(&work_lock);
    for (size_t i = 0; i < burst_count; i++) {
        if (bursts[i].ptr != ptr) continue;
        if (bursts[i].on_device)
            __atomic_sub_fetch(&e->burst_on_device[dev], bursts[i].size, __ATOMIC_RELAXED);
        bursts[i] = bursts[--burst_count];
        break;
    }
    pthread_mutex_unlock(&work_lock);
}

static void suspend(gpupool_region_elastic *e) {
    __atomic_store_n(&gp_elastic_closed, 1, __ATOMIC_RELEASE);
    gp_sleep_ns(GP_SETTLE_NS);
    size_t n = 0;
    gp_ptrmap_item *items = gp_ptrmap_snapshot(&n);
    synchronize(items, n);
    uint64_t stuck = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].kind == GP_KIND_BURST) continue; /* place_bursts moves them */
        if (!movable(&items[i]) || prefetch(&items[i], CU_DEVICE_CPU) != 0) {
            stuck += items[i].size; /* arrays, VMM handles, pool memory: not managed */
            continue;
        }
        moved[items[i].dev] += items[i].size;
        __atomic_add_fetch(&e->host_bytes[items[i].dev], items[i].size, __ATOMIC_RELAXED);
    }
    suspended = 1;
    place_bursts(e);
    synchronize(items, n);
    free(items);
    if (stuck != 0) {
        char text[32];
        gp_format_bytes(stuck, text, sizeof text);
        gp_log(GP_LOG_WARN,
               "suspended; %s stay on the GPU (not managed memory: arrays, "
               "virtual-memory handles or pool allocations)",
               text);
    }
}

/* 0 when resumed; -1 when a GPU lacks room for what this process moved (it stays suspended) */
static int resume(gpupool_region_elastic *e) {
    size_t n = 0;
    gp_ptrmap_item *items = gp_ptrmap_snapshot(&n);
    __typeof__(&cuMemGetInfo_v2) info = GP_REAL(cuMemGetInfo_v2);
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        if (moved[dev] == 0) continue;
        for (size_t i = 0; i < n; i++) {
            if (items[i].dev != dev || !movable(&items[i])) continue;
            size_t free_bytes = 0, total = 0;
            if (info == NULL || set_context(items[i].ctx) != 0 ||
                info(&free_bytes, &total) != CUDA_SUCCESS || free_bytes < moved[dev]) {
                free(items);
                return -1;
            }
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (movable(&items[i]) && items[i].kind == GP_KIND_DEVPTR)
            prefetch(&items[i], items[i].dev);
    }
    synchronize(items, n);
    free(items);
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        uint64_t *host = &e->host_bytes[dev];
        uint64_t back = moved[dev] < *host ? moved[dev] : *host;
        __atomic_sub_fetch(host, back, __ATOMIC_RELAXED);
        moved[dev] = 0;
    }
    suspended = 0;
    __atomic_store_n(&gp_elastic_closed, 0, __ATOMIC_RELEASE);
    return 0;
}

static void step(void) {
    gpupool_region_elastic *e = gp_region_elastic();
    if (e == NULL) return;
    uint64_t seq = __atomic_load_n(&e->control_seq, __ATOMIC_ACQUIRE);
    uint32_t want = __atomic_load_n(&e->control, __ATOMIC_ACQUIRE);
    uint32_t state = GP_ACK_RUNNING;
    pthread_mutex_lock(&work_lock);
    if (want == GP_ELASTIC_SUSPEND && !suspended) suspend(e);
    if (want == GP_ELASTIC_RUN && suspended && resume(e) != 0) state = GP_ACK_WAITING;
    if (want == GP_ELASTIC_RUN && !suspended) spill(e);
    if (burst_count > 0) place_bursts(e);
    if (suspended && state != GP_ACK_WAITING) state = GP_ACK_SUSPENDED;
    pthread_mutex_unlock(&work_lock);
    int slot = gp_region_slot();
    if (slot < 0) return;
    __atomic_store_n(&e->ack_state[slot], state, __ATOMIC_RELAXED);
    if (state != GP_ACK_WAITING) __atomic_store_n(&e->ack_seq[slot], seq, __ATOMIC_RELEASE);
}

static void *poll_loop(void *arg) {
    (void)arg;
    for (;;) {
        step();
        gp_sleep_ns(GP_POLL_NS);
    }
    return NULL;
}

void gp_elastic_start(void) {
    if (!enabled || __atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL)) return;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    if (pthread_create(&thread, &attr, poll_loop, NULL) != 0)
        gp_log(GP_LOG_WARN, "cannot start the elastic-memory thread: this process cannot be "
                            "suspended");
    pthread_attr_destroy(&attr);
}

/* a child starts with none of its parent's allocations and no poller */
void gp_elastic_after_fork(void) {
    started = 0;
    suspended = 0;
    gp_elastic_closed = 0;
    memset(moved, 0, sizeof moved);
    bursts = NULL; /* the parent's, not the child's (its copy leaks, as the parent's table) */
    burst_count = burst_capacity = 0;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    work_lock = fresh;
}
