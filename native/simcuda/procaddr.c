/*
 * Entry-point lookup (cuGetProcAddress) and the per-thread-default-stream entry points.
 *
 * CUDA 12 and 13 runtimes fetch driver functions by base name and version ("cuMemAlloc", 12040)
 * rather than by dlsym; the driver answers with the newest variant not newer than the version, and
 * with the _ptsz/_ptds variant when the per-thread default stream is asked for. The simulated
 * driver has one default stream per context, so its per-thread variants share the plain code.
 */
#define _GNU_SOURCE
#include <string.h>

#include "gpupool_procs.h"
#include "sim.h"

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

/* the runtimes' private tables of driver functions: the simulated driver has none (a runtime
 * would fall back to, or fail without, them; gpupool's tests use only the public entry points) */
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (ppExportTable == NULL || pExportTableId == NULL) return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- _ptsz / _ptds exports ------------------------------------------------------------------ */

#define PT(name, ret_args, call_args)                                                              \
    CUresult name ret_args;                                                                        \
    CUresult name ret_args { return call_args; }

PT(cuLaunchKernel_ptsz,
   (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
    unsigned shm, CUstream s, void **params, void **extra),
   cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
PT(cuLaunchCooperativeKernel_ptsz,
   (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
    unsigned shm, CUstream s, void **params),
   cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, s, params))
PT(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *c, CUfunction f, void **p, void **e),
   cuLaunchKernelEx(c, f, p, e))
PT(cuGraphLaunch_ptsz, (CUgraphExec g, CUstream s), cuGraphLaunch(g, s))
PT(cuStreamSynchronize_ptsz, (CUstream s), cuStreamSynchronize(s))
PT(cuStreamQuery_ptsz, (CUstream s), cuStreamQuery(s))
PT(cuStreamWaitEvent_ptsz, (CUstream s, CUevent e, unsigned f), cuStreamWaitEvent(s, e, f))
PT(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode m), cuStreamBeginCapture_v2(s, m))
PT(cuStreamBeginCapture_ptsz, (CUstream s), cuStreamBeginCapture(s))
PT(cuStreamEndCapture_ptsz, (CUstream s, CUgraph *g), cuStreamEndCapture(s, g))
PT(cuStreamIsCapturing_ptsz, (CUstream s, CUstreamCaptureStatus *c), cuStreamIsCapturing(s, c))
PT(cuEventRecord_ptsz, (CUevent e, CUstream s), cuEventRecord(e, s))
PT(cuMemAllocAsync_ptsz, (CUdeviceptr * p, size_t n, CUstream s), cuMemAllocAsync(p, n, s))
PT(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr * p, size_t n, CUmemoryPool pool, CUstream s),
   cuMemAllocFromPoolAsync(p, n, pool, s))
PT(cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s), cuMemFreeAsync(p, s))
PT(cuMemcpyAsync_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),
   cuMemcpyAsync(d, s, n, st))
PT(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr d, const void *s, size_t n, CUstream st),
   cuMemcpyHtoDAsync_v2(d, s, n, st))
PT(cuMemcpyDtoHAsync_v2_ptsz, (void *d, CUdeviceptr s, size_t n, CUstream st),
   cuMemcpyDtoHAsync_v2(d, s, n, st))
PT(cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),
   cuMemcpyDtoDAsync_v2(d, s, n, st))
PT(cuMemsetD8Async_ptsz, (CUdeviceptr d, unsigned char v, size_t n, CUstream s),
   cuMemsetD8Async(d, v, n, s))
PT(cuMemsetD32Async_ptsz, (CUdeviceptr d, unsigned int v, size_t n, CUstream s),
   cuMemsetD32Async(d, v, n, s))
PT(cuMemcpy_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n), cuMemcpy(d, s, n))
PT(cuMemcpyHtoD_v2_ptds, (CUdeviceptr d, const void *s, size_t n), cuMemcpyHtoD_v2(d, s, n))
PT(cuMemcpyDtoH_v2_ptds, (void *d, CUdeviceptr s, size_t n), cuMemcpyDtoH_v2(d, s, n))
PT(cuMemcpyDtoD_v2_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n), cuMemcpyDtoD_v2(d, s, n))
PT(cuMemsetD8_v2_ptds, (CUdeviceptr d, unsigned char v, size_t n), cuMemsetD8_v2(d, v, n))
PT(cuMemsetD32_v2_ptds, (CUdeviceptr d, unsigned int v, size_t n), cuMemsetD32_v2(d, v, n))

/* ---- the lookup table (gpupool_procs.h) ------------------------------------------------------ */

typedef struct {
    const char *name; /* base name, as the runtime asks for it */
    int since;        /* first CUDA version (1000*major + 10*minor) this variant answers */
    void *fn;
    int per_thread; /* the _ptsz/_ptds flavour */
} sim_entry;

#define E(name, since, fn, per_thread) {name, since, (void *)(fn), per_thread},

static const sim_entry sim_table[] = {GP_PROCS_WRAPPED(E) GP_PROCS_OTHER(E)};

/* the newest variant of `symbol` of the given flavour not newer than `version` */
static const sim_entry *newest(const char *symbol, int version, int per_thread, int *known) {
    const sim_entry *best = NULL;
    for (size_t i = 0; i < sizeof sim_table / sizeof sim_table[0]; i++) {
        const sim_entry *e = &sim_table[i];
        if (strcmp(e->name, symbol) != 0) continue;
        *known = 1;
        if (e->per_thread == per_thread && e->since <= version &&
            (best == NULL || e->since > best->since))
            best = e;
    }
    return best;
}

static CUresult sim_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                           CUdriverProcAddressQueryResult *status) {
    if (symbol == NULL || pfn == NULL || cudaVersion <= 0 ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int known = 0;
    /* entry points without a stream, or asked for at a version before their per-thread flavour,
     * answer with the legacy variant */
    const sim_entry *best = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        best = newest(symbol, cudaVersion, 1, &known);
    if (best == NULL) best = newest(symbol, cudaVersion, 0, &known);
    *pfn = NULL;
    if (best == NULL) {
        if (status != NULL)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (status != NULL) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return sim_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    return sim_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
