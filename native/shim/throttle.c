/*
 * The compute share: a duty cycle of X % of the GPU, measured from the workload's own GPU time.
 *
 * Launches on a device are grouped in batches (one, or as many as take about GP_BATCH_NS of GPU
 * time); after a batch we record an event. When an event has completed, the batch's busy time is
 * its end (the previous end plus cuEventElapsedTime between the two events, anchored once to the
 * host clock by waiting for the first event) less the later of the previous end and the batch's
 * submission: GPU time the workload really used, whatever the launch kind (kernels, cooperative
 * kernels, graphs). A token bucket, one per device for the whole share (it lives in the shared
 * region, so a share's processes together hold X %), earns X % of wall time, at most X % of
 * GP_BURST_NS ahead, and pays for busy time; while it is in debt, the next batch waits (the
 * launch call sleeps). At most
 * GP_MAX_PENDING batches are in flight, so work cannot be queued far ahead of the accounting.
 *
 * Launches inside a batch are not timed (a clock read a launch would be most of the library's
 * cost on a launch-bound loop): the clock is read when a batch opens and closes, and a batch that
 * stayed open longer than its launches could keep the GPU busy plus GP_GAP_NS had idle time in
 * it: its busy time is bounded by its launches x the average launch's GPU time.
 *
 * Before each batch the process also holds its GPU's lease (arbiter.c), and every launch in it
 * checks (two loads of the view) that the lease is still its own, so no other share's work
 * runs while its batches do: what the events measure is its own GPU time even when shares are
 * busy together. The bucket's burst is longer than a lease, so that credit earned while waiting
 * for the lease is not lost. Under the `share` policy the arbiter alone splits the GPU (by
 * weight, work-conserving): there is no bucket to wait for.
 */
#include <pthread.h>
#include <string.h>

#include "shim.h"

#define GP_MAX_PENDING 2
#define GP_EVENT_POOL 8
#define GP_BATCH_NS (500 * 1000ULL)
#define GP_MAX_BATCH 64u
#define GP_BURST_NS (100 * GP_NS_PER_MS)
#define GP_GAP_NS GP_NS_PER_MS
#define GP_MAX_SLEEP_NS (100 * GP_NS_PER_MS)

typedef struct {
    CUevent end;
    uint64_t submit_ns;
    uint32_t launches;
    int after_gap; /* closed late: its end may include idle time, bound it by the estimate */
} gp_batch;

typedef struct {
    pthread_mutex_t lock;
    int active;
    CUcontext ctx; /* the context our events belong to */
    CUevent pool[GP_EVENT_POOL];
    int pool_count;
    gp_batch pending[GP_MAX_PENDING];
    int head, count;
    int open; /* a batch is being filled */
    CUstream stream;
    int ptsz;
    int arbitrated; /* the open batch holds the GPU's lease */
    uint64_t submit_ns;
    uint32_t launches, batch_target;
    CUevent last_end; /* end event of the latest accounted batch, NULL before the anchor */
    uint64_t last_end_ns, frontier_ns;
    uint64_t avg_launch_ns;
    int dev;
    uint32_t percent;
    int64_t credit_ns; /* the share's bucket as last seen */
} gp_throttle;

static gp_throttle throttles[GP_MAX_DEVICES];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int any_limit;

static void init_throttles(void) {
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        pthread_mutex_init(&throttles[dev].lock, NULL);
        throttles[dev].batch_target = 1;
    }
    any_limit = gp_region_any_compute_limit() || gp_arbiter_priority() != GP_PRIORITY_UNSET;
}

void gp_throttle_after_fork(void) {
    /* the child has no GPU context of its parent's: start over */
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        memset(&throttles[dev], 0, sizeof throttles[dev]);
        pthread_mutex_init(&throttles[dev].lock, NULL);
        throttles[dev].batch_target = 1;
    }
}

static CUevent take_event(gp_throttle *t) {
    if (t->pool_count > 0) return t->pool[--t->pool_count];
    __typeof__(&cuEventCreate) create = GP_REAL(cuEventCreate);
    CUevent event = NULL;
    if (create == NULL || create(&event, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    return event;
}

static void give_event(gp_throttle *t, CUevent event) {
    if (event == NULL) return;
    if (t->pool_count < GP_EVENT_POOL) {
        t->pool[t->pool_count++] = event;
        return;
    }
    __typeof__(&cuEventDestroy_v2) destroy = GP_REAL(cuEventDestroy_v2);
    if (destroy != NULL) destroy(event);
}

static CUstream effective_stream(CUstream stream, int ptsz) {
    return ptsz && stream == NULL ? CU_STREAM_PER_THREAD : stream;
}

/* work launched into a capturing stream is recorded into a graph, not run: leave it alone */
static int capturing(CUstream stream, int ptsz) {
    __typeof__(&cuStreamIsCapturing) is_capturing = GP_REAL(cuStreamIsCapturing);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (is_capturing == NULL) return 0;
    if (is_capturing(effective_stream(stream, ptsz), &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUresult record(CUevent event, CUstream stream, int ptsz) {
    if (ptsz) {
        __typeof__(&cuEventRecord_ptsz) record_ptsz = GP_REAL(cuEventRecord_ptsz);
        if (record_ptsz != NULL) return record_ptsz(event, stream);
    }
    __typeof__(&cuEventRecord) rec = GP_REAL(cuEventRecord);
    return rec ? rec(event, effective_stream(stream, ptsz)) : CUDA_ERROR_NOT_INITIALIZED;
}

/* pay GPU time from start to end into the share's bucket (shared by all its processes, in the
 * region), refill it, and see what is left */
static void settle(gp_throttle *t, uint64_t now, uint64_t start, uint64_t end) {
    int64_t cap = (int64_t)(GP_BURST_NS * t->percent / 100);
    t->credit_ns = gp_region_credit(t->dev, t->percent, now, cap, start, end);
}

static void charge(gp_throttle *t, const gp_batch *b, uint64_t end_ns) {
    uint64_t start = b->submit_ns > t->frontier_ns ? b->submit_ns : t->frontier_ns;
    uint64_t busy = end_ns > start ? end_ns - start : 0;
    if (b->after_gap) {
        uint64_t estimate = (uint64_t)b->launches * t->avg_launch_ns;
        if (t->avg_launch_ns != 0 && busy > estimate) {
            busy = estimate;
            start = end_ns - busy;
        }
    } else if (b->launches > 0 && busy > 0) {
        /* a batch that ended before the frontier (its time already counted, as when batches
         * overlap) says nothing of its launches' length: it does not count here */
        uint64_t per_launch = busy / b->launches;
        t->avg_launch_ns = t->avg_launch_ns ? (3 * t->avg_launch_ns + per_launch) / 4 : per_launch;
        uint64_t target = t->avg_launch_ns ? GP_BATCH_NS / t->avg_launch_ns : 1;
        t->batch_target = target < 1 ? 1 : target > GP_MAX_BATCH ? GP_MAX_BATCH : (uint32_t)target;
    }
    if (busy > 0) settle(t, gp_now_ns(), start, end_ns);
    if (end_ns > t->frontier_ns) t->frontier_ns = end_ns;
}

/* account every completed batch, oldest first; with `wait`, wait for the oldest one */
static void account(gp_throttle *t, int wait) {
    __typeof__(&cuEventQuery) query = GP_REAL(cuEventQuery);
    __typeof__(&cuEventSynchronize) sync = GP_REAL(cuEventSynchronize);
    __typeof__(&cuEventElapsedTime) elapsed = GP_REAL(cuEventElapsedTime);
    while (t->count > 0) {
        gp_batch *b = &t->pending[t->head];
        CUresult rc = wait ? sync(b->end) : query(b->end);
        wait = 0;
        if (rc == CUDA_ERROR_NOT_READY) break;
        uint64_t now = gp_now_ns();
        t->head = (t->head + 1) % GP_MAX_PENDING;
        t->count--;
        if (rc != CUDA_SUCCESS) {
            give_event(t, b->end);
            continue;
        }
        float ms = 0.0f;
        uint64_t end_ns = now; /* the anchor: the host clock when the first event completed */
        if (t->last_end != NULL && elapsed(&ms, t->last_end, b->end) == CUDA_SUCCESS) {
            int64_t delta = (int64_t)((double)ms * 1e6);
            end_ns = (uint64_t)((int64_t)t->last_end_ns + delta);
            if (end_ns > now) end_ns = now;
        }
        charge(t, b, end_ns);
        give_event(t, t->last_end);
        t->last_end = b->end;
        t->last_end_ns = end_ns;
    }
}

static void close_batch(gp_throttle *t) {
    t->open = 0;
    if (t->launches == 0 || capturing(t->stream, t->ptsz)) return;
    /* launches are not timed (a clock read a launch is a measurable cost): a batch open for a
     * gap longer than its launches could keep the GPU busy had idle time in it */
    uint64_t span = gp_now_ns() - t->submit_ns;
    int after_gap = span > GP_GAP_NS + (uint64_t)t->launches * t->avg_launch_ns;
    CUevent event = take_event(t);
    if (event == NULL) return;
    if (record(event, t->stream, t->ptsz) != CUDA_SUCCESS) {
        give_event(t, event);
        return;
    }
    int slot = (t->head + t->count) % GP_MAX_PENDING;
    t->pending[slot] = (gp_batch){
        .end = event, .submit_ns = t->submit_ns, .launches = t->launches, .after_gap = after_gap};
    t->count++;
    /* the first batch anchors event time to the host clock: wait for it */
    if (t->last_end == NULL) account(t, 1);
}

/* wait until the share's work on the GPU is done and accounted */
static void drain(gp_throttle *t) {
    while (t->count > 0) account(t, 1);
}

static void wait_for_credit(gp_throttle *t) {
    account(t, 0);
    while (t->count >= GP_MAX_PENDING) account(t, 1);
    settle(t, gp_now_ns(), 0, 0);
    if (t->credit_ns < 0 && gp_arbiter_holds(t->dev)) {
        /* never sleep on the GPU's lease */
        drain(t);
        gp_arbiter_release(t->dev);
    }
    if (t->credit_ns >= 0) return;
    uint64_t since = gp_now_ns(), now = since;
    gp_arbiter_rest(t->dev, since);
    while (t->credit_ns < 0) {
        uint64_t need = (uint64_t)(-t->credit_ns) * 100 / t->percent;
        gp_sleep_ns(need < GP_MAX_SLEEP_NS ? need : GP_MAX_SLEEP_NS);
        account(t, 0);
        now = gp_now_ns();
        settle(t, now, 0, 0);
    }
    gp_region_count_wait(t->dev, GP_WAIT_CAP, now - since);
}

/* before a batch: give the lease back if its time is up and another share waits, pay for the
 * cap (`share` under the arbiter has no cap: the arbiter splits a busy GPU by weight), and hold
 * the GPU's lease */
static void take_turn(gp_throttle *t) {
    uint64_t now = gp_now_ns(); /* one clock read for the batch's checks */
    int arbitrated = gp_arbiter_active(t->dev, now);
    if (arbitrated && gp_arbiter_should_yield(t->dev, now)) {
        drain(t);
        gp_arbiter_release(t->dev);
    }
    if (!arbitrated || gp_region_policy() == GP_POLICY_CAP) {
        wait_for_credit(t);
    } else {
        account(t, 0);
        while (t->count >= GP_MAX_PENDING) account(t, 1);
    }
    /* next to an active high share, a low share keeps one batch in flight at most: the high one
     * then waits for little */
    if (gp_arbiter_priority() == GP_PRIORITY_LOW && gp_arbiter_high_active(t->dev, now)) drain(t);
    if (arbitrated) gp_arbiter_acquire(t->dev);
    t->arbitrated = arbitrated;
}

/* the driver's entry points do not change once resolved: look once, not at every launch */
static int events_available(void) {
    static int known; /* 0 not yet, 1 yes, -1 no */
    int state = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (state == 0) {
        state = GP_REAL(cuEventCreate) && GP_REAL(cuEventRecord) && GP_REAL(cuEventQuery) &&
                        GP_REAL(cuEventSynchronize) && GP_REAL(cuEventElapsedTime)
                    ? 1
                    : -1;
        __atomic_store_n(&known, state, __ATOMIC_RELAXED);
    }
    return state > 0;
}

static int current_context_device(CUcontext *ctx) {
    uint64_t handle = 0;
    int dev = gp_current_device_and_context(&handle);
    *ctx = (CUcontext)(uintptr_t)handle;
    return dev;
}

/* the device of a launch made while no context is current on the calling thread (a runtime may
 * launch on a stream of a context it made current on another thread): the stream's own context,
 * made current around the launch so that our events belong to it; 1 if it was pushed */
static int push_stream_context(CUstream stream) {
    __typeof__(&cuStreamGetCtx) get_ctx = GP_REAL(cuStreamGetCtx);
    __typeof__(&cuCtxPushCurrent_v2) push = GP_REAL(cuCtxPushCurrent_v2);
    CUcontext ctx = NULL;
    if (get_ctx == NULL || push == NULL || GP_REAL(cuCtxPopCurrent_v2) == NULL) return 0;
    if (get_ctx(stream, &ctx) != CUDA_SUCCESS || ctx == NULL) return 0;
    return push(ctx) == CUDA_SUCCESS;
}

static void pop_stream_context(gp_launch *launch) {
    if (!launch->pushed) return;
    CUcontext ctx = NULL;
    GP_REAL(cuCtxPopCurrent_v2)(&ctx);
    launch->pushed = 0;
}

static void throttle_before(gp_launch *launch, CUstream stream, int is_ptsz);

void gp_throttle_before(gp_launch *launch, CUstream stream, int is_ptsz) {
    throttle_before(launch, stream, is_ptsz);
    if (launch->dev < 0) pop_stream_context(launch);
}

static void throttle_before(gp_launch *launch, CUstream stream, int is_ptsz) {
    static int initialised;
    if (!__atomic_load_n(&initialised, __ATOMIC_ACQUIRE)) {
        pthread_once(&init_once, init_throttles);
        __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
    }
    launch->dev = -1;
    launch->pushed = 0;
    if (!any_limit) return;
    CUcontext ctx = NULL;
    int dev = current_context_device(&ctx);
    if (dev < 0 && (launch->pushed = push_stream_context(stream)) != 0)
        dev = current_context_device(&ctx);
    if (dev < 0 || !events_available()) return;
    uint32_t percent = gp_region_compute_limit(dev);
    gp_throttle *t = &throttles[dev];
    if (percent >= 100 && gp_arbiter_priority() == GP_PRIORITY_UNSET) return;
    pthread_mutex_lock(&t->lock);
    if (t->ctx != ctx) {
        /* another context: our events belong to the old one; forget them */
        memset(t->pool, 0, sizeof t->pool);
        t->pool_count = 0;
        t->count = 0;
        t->last_end = NULL;
        t->open = 0;
        t->ctx = ctx;
    }
    if (!t->active) {
        t->active = 1;
        t->frontier_ns = 0;
    }
    t->dev = dev;
    t->percent = percent;
    /* the lease taken back or asked back (a holder gone quiet loses it when another share
     * waits) closes the batch at the next launch: no launch runs without it */
    if (t->open && (t->stream != stream || t->ptsz != is_ptsz ||
                    (t->arbitrated && !gp_arbiter_launch_ok(dev))))
        close_batch(t);
    if (!t->open) {
        /* asked when a batch opens, not at every launch: a capture that begins on the stream of
         * an open batch is found when the batch closes, which then records nothing */
        if (capturing(stream, is_ptsz)) {
            pthread_mutex_unlock(&t->lock);
            return;
        }
        take_turn(t);
        t->open = 1;
        t->stream = stream;
        t->ptsz = is_ptsz;
        t->submit_ns = gp_now_ns();
        t->launches = 0;
        if (t->arbitrated)
            gp_arbiter_batch(dev, t->submit_ns, (uint64_t)t->batch_target * t->avg_launch_ns);
    }
    launch->dev = dev; /* the lock stays held until gp_throttle_after */
}

void gp_throttle_after(gp_launch *launch, CUresult rc) {
    if (launch->dev < 0) return;
    gp_throttle *t = &throttles[launch->dev];
    if (rc == CUDA_SUCCESS) {
        t->launches++;
        if (t->arbitrated) gp_arbiter_launched(launch->dev);
        if (t->launches >= t->batch_target) close_batch(t);
    } else if (t->launches == 0) {
        t->open = 0;
    }
    pthread_mutex_unlock(&t->lock);
    pop_stream_context(launch);
}
