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

#include "sim.h"

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

/* ---- _ptsz / _ptds exports ------------------------------------------------------------------ */

#define PT(name, ret_args, call_args)                                                            \
    CUresult name ret_args;                                                                      \
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
PT(cuMemAllocAsync_ptsz, (CUdeviceptr *p, size_t n, CUstream s), cuMemAllocAsync(p, n, s))
PT(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s),
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

/* ---- the lookup table ------------------------------------------------------------------------- */

typedef struct {
    const char *name;  /* base name, as the runtime asks for it */
    int since;         /* first CUDA version (1000*major + 10*minor) this variant answers */
    void *fn;          /* the variant for the legacy default stream */
    void *fn_per_thread; /* the _ptsz/_ptds variant, or NULL when it has none */
} sim_entry;

#define E(name, since, fn) {name, since, (void *)(fn), NULL}
#define EP(name, since, fn, pt) {name, since, (void *)(fn), (void *)(pt)}

static const sim_entry sim_table[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    E("cuDeviceComputeCapability", 2000, cuDeviceComputeCapability),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    E("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    EP("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    EP("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
    EP("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    EP("cuStreamBeginCapture", 10000, cuStreamBeginCapture, cuStreamBeginCapture_ptsz),
    EP("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    EP("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    EP("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    E("cuEventCreate", 2000, cuEventCreate),
    EP("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuModuleLoad", 2000, cuModuleLoad),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuLibraryLoadData", 12000, cuLibraryLoadData),
    E("cuLibraryUnload", 12000, cuLibraryUnload),
    E("cuLibraryGetKernel", 12000, cuLibraryGetKernel),
    E("cuKernelGetFunction", 12000, cuKernelGetFunction),
    EP("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    EP("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    EP("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel,
       cuLaunchCooperativeKernel_ptsz),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    E("cuGraphInstantiate", 10000, cuGraphInstantiate_v2),
    E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    EP("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    EP("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    EP("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemHostAlloc", 2020, cuMemHostAlloc),
    E("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    E("cuMemFreeHost", 2000, cuMemFreeHost),
    E("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    E("cuMemHostUnregister", 4000, cuMemHostUnregister),
    E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    E("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange),
    E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    E("cuFuncGetAttribute", 2020, cuFuncGetAttribute),
    E("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,
      cuOccupancyMaxActiveBlocksPerMultiprocessor),
    EP("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    EP("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
    EP("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    EP("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    EP("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    EP("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    EP("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    EP("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    EP("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    EP("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    EP("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    EP("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    EP("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),
};

static CUresult sim_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                           CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL || cudaVersion <= 0 ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    const sim_entry *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof sim_table / sizeof sim_table[0]; i++) {
        const sim_entry *e = &sim_table[i];
        if (strcmp(e->name, symbol) != 0)
            continue;
        known = 1;
        if (e->since <= cudaVersion && (best == NULL || e->since > best->since))
            best = e;
    }
    *pfn = NULL;
    if (best == NULL) {
        if (status != NULL)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    *pfn = per_thread && best->fn_per_thread != NULL ? best->fn_per_thread : best->fn;
    if (status != NULL)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return sim_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return sim_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
