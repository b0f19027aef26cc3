/* Contexts (primary and created), the per-thread context stack, streams and events; what a
 * context's end frees is teardown.c's, above the parts that hold what it frees. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define SIM_CTX_STACK 64
static __thread sim_ctx *tls_stack[SIM_CTX_STACK];
static __thread int tls_depth;

sim_ctx *sim_current_ctx(void) { return tls_depth > 0 ? tls_stack[tls_depth - 1] : NULL; }

CUresult sim_check_ctx(sim_ctx *ctx) {
    if (ctx == NULL || ctx->magic != SIM_MAGIC_CTX || (ctx->primary && !ctx->active))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (sim_gpu_lost(ctx->gpu)) return SIM_LOST_ERROR;
    return CUDA_SUCCESS;
}

CUresult sim_current_ctx_checked(sim_ctx **out) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    *out = sim_current_ctx();
    return sim_check_ctx(*out);
}

static void sim_ctx_setup(sim_ctx *ctx, CUdevice dev, int primary, unsigned int flags) {
    memset(ctx, 0, sizeof *ctx);
    ctx->magic = SIM_MAGIC_CTX;
    ctx->ordinal = dev;
    ctx->gpu = g_sim.phys[dev];
    ctx->primary = primary;
    ctx->flags = flags;
    ctx->null_stream.magic = SIM_MAGIC_STREAM;
    ctx->null_stream.ctx = ctx;
}

void sim_ctx_link_mem(sim_ctx *ctx, sim_mem *m) {
    pthread_mutex_lock(&g_sim.mu);
    m->ctx = ctx;
    m->prev = NULL;
    m->next = ctx->mems;
    if (ctx->mems != NULL) ctx->mems->prev = m;
    ctx->mems = m;
    pthread_mutex_unlock(&g_sim.mu);
}

void sim_ctx_unbind(sim_ctx *ctx) {
    for (int i = 0; i < tls_depth; i++)
        if (tls_stack[i] == ctx) tls_stack[i] = NULL;
    while (tls_depth > 0 && tls_stack[tls_depth - 1] == NULL) tls_depth--;
}

/* ---- primary contexts -------------------------------------------------------------------- */

CUresult sim_device_checked(CUdevice dev) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (dev < 0 || dev >= g_sim.count) return CUDA_ERROR_INVALID_DEVICE;
    return sim_gpu_lost(g_sim.phys[dev]) ? SIM_LOST_ERROR : CUDA_SUCCESS;
}

sim_ctx *sim_primary(CUdevice dev) {
    pthread_mutex_lock(&g_sim.mu);
    sim_ctx *ctx = g_sim.primary[dev];
    if (ctx == NULL) {
        ctx = malloc(sizeof *ctx);
        if (ctx != NULL) {
            sim_ctx_setup(ctx, dev, 1, 0);
            g_sim.primary[dev] = ctx;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    return ctx;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CUresult rc = sim_device_checked(dev);
    if (rc != CUDA_SUCCESS) return rc;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *ctx = sim_primary(dev);
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_sim.mu);
    ctx->refcount++;
    ctx->active = 1;
    pthread_mutex_unlock(&g_sim.mu);
    *pctx = (CUcontext)ctx;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    CUresult rc = sim_device_checked(dev);
    if (rc != CUDA_SUCCESS) return rc;
    if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *ctx = sim_primary(dev);
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *flags = ctx->flags;
    *active = ctx->active;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    CUresult rc = sim_device_checked(dev);
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx *ctx = sim_primary(dev);
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->flags = flags;
    return CUDA_SUCCESS;
}

/* ---- created contexts and the context stack ------------------------------------------------ */

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CUresult rc = sim_device_checked(dev);
    if (rc != CUDA_SUCCESS) return rc;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (tls_depth >= SIM_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_ctx *ctx = malloc(sizeof *ctx);
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_ctx_setup(ctx, dev, 0, flags);
    tls_stack[tls_depth++] = ctx;
    *pctx = (CUcontext)ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext hctx) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx *ctx = (sim_ctx *)hctx;
    if (ctx == NULL || ctx->magic != SIM_MAGIC_CTX) return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth >= SIM_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (tls_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    sim_ctx *ctx = tls_stack[--tls_depth];
    if (pctx != NULL) *pctx = (CUcontext)ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext hctx) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx *ctx = (sim_ctx *)hctx;
    if (ctx == NULL) { /* unbinding pops the stack's top */
        if (tls_depth > 0) tls_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx->magic != SIM_MAGIC_CTX) return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == 0) tls_depth = 1;
    tls_stack[tls_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)sim_current_ctx();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    *device = ctx->ordinal;
    return CUDA_SUCCESS;
}

static uint64_t sim_stream_end(sim_stream *st) {
    return __atomic_load_n(&st->last_end_ns, __ATOMIC_ACQUIRE);
}

/* the end of the context's work; `blocking_only` leaves out non-blocking streams */
static uint64_t sim_ctx_end(sim_ctx *ctx, int blocking_only) {
    pthread_mutex_lock(&g_sim.mu);
    uint64_t end = sim_stream_end(&ctx->null_stream);
    for (sim_stream *st = ctx->streams; st != NULL; st = st->next) {
        if (blocking_only && (st->flags & CU_STREAM_NON_BLOCKING)) continue;
        uint64_t e = sim_stream_end(st);
        if (e > end) end = e;
    }
    pthread_mutex_unlock(&g_sim.mu);
    return end;
}

void sim_ctx_wait_blocking(sim_ctx *ctx) { sim_sleep_until(sim_ctx_end(ctx, 1)); }

CUresult cuCtxSynchronize(void) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    sim_sleep_until(sim_ctx_end(ctx, 0));
    return sim_gpu_lost(ctx->gpu) ? SIM_LOST_ERROR : CUDA_SUCCESS;
}

/* ---- streams ------------------------------------------------------------------------------- */

/* The stream a call names: 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the current
 * context's default stream (one per context in the simulation). */
CUresult sim_resolve_stream(CUstream h, sim_stream **out) {
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        sim_ctx *ctx;
        CUresult rc = sim_current_ctx_checked(&ctx);
        if (rc != CUDA_SUCCESS) return rc;
        *out = &ctx->null_stream;
        return CUDA_SUCCESS;
    }
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_stream *st = (sim_stream *)h;
    if (st->magic != SIM_MAGIC_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    rc = sim_check_ctx(st->ctx);
    if (rc != CUDA_SUCCESS) return rc;
    *out = st;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (phStream == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_stream *st = calloc(1, sizeof *st);
    if (st == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    st->magic = SIM_MAGIC_STREAM;
    st->ctx = ctx;
    st->flags = flags;
    st->priority = priority;
    pthread_mutex_lock(&g_sim.mu);
    st->next = ctx->streams;
    ctx->streams = st;
    pthread_mutex_unlock(&g_sim.mu);
    *phStream = (CUstream)st;
    return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc == CUDA_SUCCESS) *pctx = (CUcontext)st->ctx;
    return rc;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) {
    return cuStreamCreateWithPriority(phStream, flags, 0);
}

CUresult cuStreamSynchronize(CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (st->capture != NULL) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_sleep_until(sim_stream_end(st));
    return sim_gpu_lost(st->ctx->gpu) ? SIM_LOST_ERROR : CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    return sim_now_ns() >= sim_stream_end(st) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* ---- events -------------------------------------------------------------------------------- */

static CUresult sim_event_checked(CUevent h, sim_event **out) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_event *ev = (sim_event *)h;
    if (ev == NULL || ev->magic != SIM_MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    *out = ev;
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int flags) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (phEvent == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    ev->magic = SIM_MAGIC_EVENT;
    ev->ctx = ctx;
    ev->flags = flags;
    pthread_mutex_lock(&g_sim.mu);
    ev->next = ctx->events;
    ctx->events = ev;
    pthread_mutex_unlock(&g_sim.mu);
    *phEvent = (CUevent)ev;
    return CUDA_SUCCESS;
}

/* The event completes when the stream's queued work does (now, on an idle stream). */
CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    sim_event *ev;
    sim_stream *st;
    CUresult rc = sim_event_checked(hEvent, &ev);
    if (rc == CUDA_SUCCESS) rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (st->capture != NULL) { /* a fork/join point of the capture: no time of its own */
        ev->captured = 1;
        return CUDA_SUCCESS;
    }
    uint64_t now = sim_now_ns(), end = sim_stream_end(st);
    ev->time_ns = end > now ? end : now;
    ev->recorded = 1;
    ev->captured = 0;
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent) {
    sim_event *ev;
    CUresult rc = sim_event_checked(hEvent, &ev);
    if (rc != CUDA_SUCCESS) return rc;
    if (ev->captured) return CUDA_ERROR_CAPTURED_EVENT;
    if (!ev->recorded) return CUDA_SUCCESS;
    return sim_now_ns() >= ev->time_ns ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    sim_event *ev;
    CUresult rc = sim_event_checked(hEvent, &ev);
    if (rc != CUDA_SUCCESS) return rc;
    if (ev->captured) return CUDA_ERROR_CAPTURED_EVENT;
    if (ev->recorded) sim_sleep_until(ev->time_ns);
    return sim_gpu_lost(ev->ctx->gpu) ? SIM_LOST_ERROR : CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    sim_event *start, *end;
    CUresult rc = sim_event_checked(hStart, &start);
    if (rc == CUDA_SUCCESS) rc = sim_event_checked(hEnd, &end);
    if (rc != CUDA_SUCCESS) return rc;
    if (pMilliseconds == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (start->captured || end->captured) return CUDA_ERROR_CAPTURED_EVENT;
    if (!start->recorded || !end->recorded || (start->flags & CU_EVENT_DISABLE_TIMING) ||
        (end->flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now_ns();
    if (now < start->time_ns || now < end->time_ns) return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)(((double)end->time_ns - (double)start->time_ns) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
    sim_event *ev;
    CUresult rc = sim_event_checked(hEvent, &ev);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_event **pp = &ev->ctx->events; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == ev) {
            *pp = ev->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    ev->magic = 0;
    free(ev);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags) {
    sim_event *ev;
    sim_stream *st;
    CUresult rc = sim_event_checked(hEvent, &ev);
    if (rc == CUDA_SUCCESS) rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!ev->recorded || ev->captured || st->capture != NULL)
        return CUDA_SUCCESS; /* nothing to wait for; capture keeps insertion order */
    /* later work on the stream starts no earlier than the event */
    uint64_t cur = sim_stream_end(st);
    while (cur < ev->time_ns && !__atomic_compare_exchange_n(&st->last_end_ns, &cur, ev->time_ns, 0,
                                                             __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return CUDA_SUCCESS;
}

/* ---- device pairs and stream priorities ------------------------------------------------------ */

CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    /* the range of the GPUs simulated here; lower numbers are higher priorities */
    if (leastPriority != NULL) *leastPriority = 0;
    if (greatestPriority != NULL) *greatestPriority = -5;
    return CUDA_SUCCESS;
}

/* the simulated GPUs of a node are all peers (NVLink or one PCIe root) */
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    CUresult rc = sim_device_checked(dev);
    if (rc == CUDA_SUCCESS) rc = sim_device_checked(peerDev);
    if (rc != CUDA_SUCCESS) return rc;
    if (canAccessPeer == NULL) return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}
