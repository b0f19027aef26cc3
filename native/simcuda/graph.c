/* Graphs, built by hand or by stream capture: what they hold (kernels, copies and fills, in
 * order), instantiated and destroyed. How a graph runs is launch.c's; the parts that add to a
 * graph (a captured copy, a kernel node) call down to this one. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "sim.h"

CUresult sim_graph_append(sim_graph *g, const sim_node *node) {
    if (g->count == g->capacity) {
        size_t cap = g->capacity ? g->capacity * 2 : 16;
        sim_node *nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (nodes == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = nodes;
        g->capacity = cap;
    }
    g->nodes[g->count++] = *node;
    return CUDA_SUCCESS;
}

sim_graph *sim_graph_new(uint32_t magic) {
    sim_graph *g = calloc(1, sizeof *g);
    if (g != NULL) g->magic = magic;
    return g;
}

void sim_graph_free(sim_graph *g) {
    g->magic = 0;
    free(g->nodes);
    free(g);
}

CUresult sim_capture_memop(sim_stream *st, int kind, CUdeviceptr dst, const void *src,
                           uint32_t value, size_t count) {
    sim_node node = {.kind = kind, .dst = dst, .src = src, .value = value, .count = count};
    return sim_graph_append(st->capture, &node);
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (phGraph == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    sim_graph *g = sim_graph_new(SIM_MAGIC_GRAPH);
    if (g == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

sim_graph *sim_graph_of(void *h, uint32_t magic) {
    sim_graph *g = h;
    return g != NULL && g->magic == magic ? g : NULL;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    SIM_UNUSED(flags); /* auto-free-on-launch, upload and priority change nothing here */
    sim_graph *g = sim_graph_of(hGraph, SIM_MAGIC_GRAPH);
    if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (phGraphExec == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_graph *exec = sim_graph_new(SIM_MAGIC_EXEC);
    if (exec == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < g->count && rc == CUDA_SUCCESS; i++)
        rc = sim_graph_append(exec, &g->nodes[i]);
    if (rc != CUDA_SUCCESS) {
        sim_graph_free(exec);
        return rc;
    }
    *phGraphExec = (CUgraphExec)exec;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize) {
    if (phErrorNode != NULL) *phErrorNode = NULL;
    if (logBuffer != NULL && bufferSize > 0) logBuffer[0] = '\0';
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_graph *g = sim_graph_of(hGraphExec, SIM_MAGIC_EXEC);
    if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
    sim_graph_free(g);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_graph *g = sim_graph_of(hGraph, SIM_MAGIC_GRAPH);
    if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
    sim_graph_free(g);
    return CUDA_SUCCESS;
}

/* ---- stream capture ---------------------------------------------------------------------- */

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (st == &st->ctx->null_stream) /* the legacy stream cannot be captured */
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    if (st->capture != NULL) return CUDA_ERROR_ILLEGAL_STATE;
    st->capture = sim_graph_new(SIM_MAGIC_GRAPH);
    return st->capture == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream) {
    return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (phGraph == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (st->capture == NULL) return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = (CUgraph)st->capture;
    st->capture = NULL;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (captureStatus == NULL) return CUDA_ERROR_INVALID_VALUE;
    *captureStatus =
        st->capture != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
