/*
 * Modules, kernels and launches: any image loads and any name resolves, since the simulation runs
 * no device code; a launch occupies its GPU's timeline for a time proportional to its threads.
 * A graph (graph.c holds what it is made of) replays its kernels, copies and fills in order.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sim.h"

typedef struct sim_module {
    uint32_t magic;
    sim_ctx *ctx;
} sim_module;

/* a CUfunction; a CUkernel is the same object, as cuLaunchKernel accepts either */
typedef struct sim_func {
    uint32_t magic;
    sim_module *module;
    char name[128];
    struct sim_func *next;
} sim_func;

static sim_func *sim_funcs; /* every function handed out, freed with their module */

/* ---- modules and libraries ------------------------------------------------------------------ */

static CUresult sim_module_new(CUmodule *out, const void *image) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (out == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_module *m = calloc(1, sizeof *m);
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SIM_MAGIC_MODULE;
    m->ctx = ctx;
    *out = (CUmodule)m;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    return sim_module_new(module, image);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            CUjit_option *options, void **optionValues) {
    if (numOptions > 0 && (options == NULL || optionValues == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_new(module, image);
}

CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    struct stat st;
    if (fname == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (stat(fname, &st) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
    return sim_module_new(module, fname);
}

static sim_module *sim_module_of(void *h) {
    sim_module *m = h;
    return m != NULL && m->magic == SIM_MAGIC_MODULE ? m : NULL;
}

CUresult cuModuleUnload(CUmodule hmod) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_module *m = sim_module_of(hmod);
    if (m == NULL) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_func **pp = &sim_funcs; *pp != NULL;) {
        sim_func *f = *pp;
        if (f->module == m) {
            *pp = f->next;
            f->magic = 0;
            free(f);
        } else {
            pp = &f->next;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    m->magic = 0;
    free(m);
    return CUDA_SUCCESS;
}

static CUresult sim_func_get(sim_func **out, void *hmod, const char *name) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_module *m = sim_module_of(hmod);
    if (m == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (out == NULL || name == NULL || name[0] == '\0') return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.mu);
    sim_func *f = sim_funcs;
    while (f != NULL && !(f->module == m && strncmp(f->name, name, sizeof f->name - 1) == 0))
        f = f->next;
    if (f == NULL && (f = calloc(1, sizeof *f)) != NULL) {
        f->magic = SIM_MAGIC_FUNC;
        f->module = m;
        strncpy(f->name, name, sizeof f->name - 1);
        f->next = sim_funcs;
        sim_funcs = f;
    }
    pthread_mutex_unlock(&g_sim.mu);
    if (f == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    return sim_func_get((sim_func **)hfunc, hmod, name);
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions) {
    if ((numJitOptions > 0 && (jitOptions == NULL || jitOptionsValues == NULL)) ||
        (numLibraryOptions > 0 && (libraryOptions == NULL || libraryOptionValues == NULL)))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_new((CUmodule *)library, code);
}

CUresult cuLibraryUnload(CUlibrary library) { return cuModuleUnload((CUmodule)library); }

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    return sim_func_get((sim_func **)pKernel, library, name);
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_func *f = (sim_func *)kernel;
    if (f == NULL || f->magic != SIM_MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (pFunc == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pFunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

/* ---- function attributes and occupancy ------------------------------------------------------- */

/* resident blocks per SM for this block size and dynamic shared memory (0: it cannot run) */
static int sim_blocks_per_sm(const gpupool_sim_gpu *rec, uint64_t threads, size_t shared) {
    if (threads == 0 || threads > 1024) return 0;
    uint64_t blocks = (uint64_t)sim_threads_per_sm(rec) / threads;
    if (shared > 0) {
        uint64_t by_shared = (uint64_t)sim_shared_per_sm(rec) / shared;
        blocks = by_shared < blocks ? by_shared : blocks;
    }
    return (int)(blocks > 32 ? 32 : blocks);
}

static CUresult sim_func_checked(CUfunction hfunc, sim_func **out) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_func *f = (sim_func *)hfunc;
    if (f == NULL || f->magic != SIM_MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    *out = f;
    return CUDA_SUCCESS;
}

/* A kernel the simulation never compiled: the attributes of a plain kernel on its GPU. */
CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    sim_func *f;
    CUresult rc = sim_func_checked(hfunc, &f);
    if (rc != CUDA_SUCCESS) return rc;
    if (pi == NULL) return CUDA_ERROR_INVALID_VALUE;
    const gpupool_sim_gpu *rec = sim_gpu(f->module->ctx->gpu);
    int arch = (int)(rec->cc_major * 10 + rec->cc_minor);
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = arch; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 49152; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize) {
    sim_func *f;
    CUresult rc = sim_func_checked(func, &f);
    if (rc != CUDA_SUCCESS) return rc;
    if (numBlocks == NULL || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
    *numBlocks =
        sim_blocks_per_sm(sim_gpu(f->module->ctx->gpu), (uint64_t)blockSize, dynamicSMemSize);
    return CUDA_SUCCESS;
}

/* ---- graphs ---------------------------------------------------------------------------------- */

static CUresult sim_launch_check(sim_func *f, const unsigned grid[3], const unsigned block[3]) {
    if (f == NULL || f->magic != SIM_MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || block[0] == 0 || block[1] == 0 ||
        block[2] == 0 || grid[1] > 65535 || grid[2] > 65535 || grid[0] > 2147483647u ||
        block[0] > 1024 || block[1] > 1024 || block[2] > 64 ||
        (uint64_t)block[0] * block[1] * block[2] > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* CUDA_KERNEL_NODE_PARAMS v1 is the prefix of v2, so one reader serves both symbols */
static CUresult sim_add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph,
                                    const CUgraphNode *dependencies, size_t numDependencies,
                                    const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_graph *g = sim_graph_of(hGraph, SIM_MAGIC_GRAPH);
    if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (phGraphNode == NULL || p == NULL || (numDependencies > 0 && dependencies == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    sim_node node = {.kind = 0,
                     .grid = {p->gridDimX, p->gridDimY, p->gridDimZ},
                     .block = {p->blockDimX, p->blockDimY, p->blockDimZ}};
    rc = sim_launch_check((sim_func *)p->func, node.grid, node.block);
    if (rc == CUDA_SUCCESS) rc = sim_graph_append(g, &node);
    if (rc == CUDA_SUCCESS) /* a node is named by its 1-based position in the graph */
        *phGraphNode = (CUgraphNode)(uintptr_t)g->count;
    return rc;
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                              const CUgraphNode *dependencies, size_t numDependencies,
                              const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams) {
    return sim_add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                 const CUgraphNode *dependencies, size_t numDependencies,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams) {
    return sim_add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies,
                               (const CUDA_KERNEL_NODE_PARAMS_v1 *)nodeParams);
}

/* ---- launches -------------------------------------------------------------------------------- */

/* Queues one kernel on the stream's GPU; a stream already holding a second of work makes the
 * caller wait first, as a full hardware queue does. */
static CUresult sim_queue_kernel(sim_stream *st, const unsigned grid[3], const unsigned block[3]) {
    uint64_t blocks = (uint64_t)grid[0] * grid[1] * grid[2];
    uint64_t threads = blocks * block[0] * block[1] * block[2];
    uint64_t backlog_end = __atomic_load_n(&st->last_end_ns, __ATOMIC_ACQUIRE);
    if (backlog_end > sim_now_ns() + SIM_QUEUE_LIMIT_NS)
        sim_sleep_until(backlog_end - SIM_QUEUE_LIMIT_NS);
    if (sim_gpu_lost(st->ctx->gpu)) return SIM_LOST_ERROR;
    uint64_t duration = sim_kernel_duration_ns(threads);
    if (!sim_mps_active()) {
        sim_timeline_queue(st->ctx->gpu, &st->last_end_ns, duration);
        return CUDA_SUCCESS;
    }
    /* an MPS client's kernel runs beside the other clients' kernels on its share of the SMs,
     * instead of taking turns with them (mps.c) */
    if (sim_mps_server_gone()) return CUDA_ERROR_MPS_SERVER_NOT_READY;
    sim_mps_queue(st->ctx->gpu, &st->last_end_ns, duration, blocks);
    return CUDA_SUCCESS;
}

static CUresult sim_launch(void *f, const unsigned grid[3], const unsigned block[3], size_t shared,
                           CUstream hStream, int cooperative) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    rc = sim_launch_check(f, grid, block);
    if (rc != CUDA_SUCCESS) return rc;
    if (cooperative) { /* every block must be resident at once */
        const gpupool_sim_gpu *rec = sim_gpu(st->ctx->gpu);
        uint64_t per_sm =
            (uint64_t)sim_blocks_per_sm(rec, (uint64_t)block[0] * block[1] * block[2], shared);
        if ((uint64_t)grid[0] * grid[1] * grid[2] > per_sm * rec->sm_count)
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    if (st->capture != NULL) {
        sim_node node = {.kind = 0,
                         .grid = {grid[0], grid[1], grid[2]},
                         .block = {block[0], block[1], block[2]}};
        return sim_graph_append(st->capture, &node);
    }
    return sim_queue_kernel(st, grid, block);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    SIM_UNUSED(kernelParams);
    SIM_UNUSED(extra);
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    return sim_launch(f, grid, block, sharedMemBytes, hStream, 0);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams) {
    SIM_UNUSED(kernelParams);
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    return sim_launch(f, grid, block, sharedMemBytes, hStream, 1);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    SIM_UNUSED(kernelParams);
    SIM_UNUSED(extra);
    if (config == NULL || (config->numAttrs > 0 && config->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    int cooperative = 0;
    for (unsigned i = 0; i < config->numAttrs; i++)
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
            cooperative = config->attrs[i].value.cooperative != 0;
    const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return sim_launch(f, grid, block, config->sharedMemBytes, config->hStream, cooperative);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    sim_graph *g = sim_graph_of(hGraphExec, SIM_MAGIC_EXEC);
    if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (st->capture != NULL) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    for (size_t i = 0; i < g->count && rc == CUDA_SUCCESS; i++) {
        const sim_node *n = &g->nodes[i];
        if (n->kind == 0)
            rc = sim_queue_kernel(st, n->grid, n->block);
        else
            rc = sim_memop_replay(n->kind, n->dst, n->src, n->value, n->count);
    }
    return rc;
}
