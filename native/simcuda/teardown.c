/* The end of a context or a stream: destroying a created context, releasing a primary one for
 * the last time or resetting it frees everything it holds (memory, pinned host memory, streams
 * and the graphs they were capturing, events), as a real driver does; a stream takes the graph
 * it was capturing with it. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "sim.h"

/* Frees everything a context holds (its memory goes back to the GPU), as destroying or
 * resetting a real context does. */
static void sim_ctx_teardown(sim_ctx *ctx) {
    pthread_mutex_lock(&g_sim.mu);
    sim_mem *mems = ctx->mems;
    sim_stream *streams = ctx->streams;
    sim_event *events = ctx->events;
    ctx->mems = NULL;
    ctx->streams = NULL;
    ctx->events = NULL;
    pthread_mutex_unlock(&g_sim.mu);
    while (mems != NULL) {
        sim_mem *next = mems->next;
        sim_mem_teardown(mems);
        mems = next;
    }
    sim_host_release_ctx(ctx);
    while (streams != NULL) {
        sim_stream *next = streams->next;
        if (streams->capture != NULL) sim_graph_free(streams->capture);
        streams->magic = 0;
        free(streams);
        streams = next;
    }
    /* a context's events die with it, as a real driver's do: none keeps a pointer to a freed
     * context, and a program that never destroys its events leaks nothing */
    while (events != NULL) {
        sim_event *next = events->next;
        events->magic = 0;
        free(events);
        events = next;
    }
    ctx->null_stream.last_end_ns = 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult rc = sim_device_checked(dev);
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx *ctx = sim_primary(dev);
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_sim.mu);
    int last = ctx->refcount == 1;
    int was_retained = ctx->refcount > 0;
    if (was_retained) ctx->refcount--;
    if (last) ctx->active = 0;
    pthread_mutex_unlock(&g_sim.mu);
    if (!was_retained) return CUDA_ERROR_INVALID_CONTEXT;
    if (last) sim_ctx_teardown(ctx);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CUresult rc = sim_device_checked(dev);
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx *ctx = sim_primary(dev);
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_ctx_teardown(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext hctx) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx *ctx = (sim_ctx *)hctx;
    if (ctx == NULL || ctx->magic != SIM_MAGIC_CTX || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_ctx_teardown(ctx);
    sim_ctx_unbind(ctx);
    ctx->magic = 0;
    free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (st == &st->ctx->null_stream) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_stream **pp = &st->ctx->streams; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    if (st->capture != NULL) sim_graph_free(st->capture);
    st->magic = 0;
    free(st); /* queued work still runs on the GPU timeline, as on a real GPU */
    return CUDA_SUCCESS;
}
