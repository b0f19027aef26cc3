/*
 * The cuGetProcAddress table: for each driver entry point, the base name a CUDA runtime asks for,
 * the first CUDA version (1000*major + 10*minor) that maps the base name to it, and whether it is
 * the per-thread-default-stream flavour (_ptsz/_ptds). Written once, as X-macros, for the
 * interception library (what it wraps) and the simulated driver (what it answers).
 *
 * Versions follow the PFN_<name>_v<version> typedefs of CUDA's cudaTypedefs.h: a per-thread
 * flavour exists from CUDA 7.0 on (the per-thread default stream's release), or from its entry
 * point's own first version when that is later, so cuLaunchKernel_ptsz is 7000, not 4000.
 *
 * X(base, since, symbol, per_thread)
 */
#ifndef GPUPOOL_PROCS_H
#define GPUPOOL_PROCS_H

/* the entry points the interception library wraps (a subset of what the driver answers) */
#define GP_PROCS_WRAPPED(X)                                                                        \
    X("cuGetProcAddress", 11030, cuGetProcAddress, 0)                                              \
    X("cuGetProcAddress", 12000, cuGetProcAddress_v2, 0)                                           \
    X("cuGetExportTable", 3000, cuGetExportTable, 0)                                               \
    X("cuMemAlloc", 3020, cuMemAlloc_v2, 0)                                                        \
    X("cuMemAllocPitch", 3020, cuMemAllocPitch_v2, 0)                                              \
    X("cuMemAllocManaged", 6000, cuMemAllocManaged, 0)                                             \
    X("cuMemAllocAsync", 11020, cuMemAllocAsync, 0)                                                \
    X("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz, 1)                                           \
    X("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, 0)                                \
    X("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz, 1)                           \
    X("cuMemCreate", 10020, cuMemCreate, 0)                                                        \
    X("cuArrayCreate", 3020, cuArrayCreate_v2, 0)                                                  \
    X("cuArray3DCreate", 3020, cuArray3DCreate_v2, 0)                                              \
    X("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate, 0)                                   \
    X("cuMemFree", 3020, cuMemFree_v2, 0)                                                          \
    X("cuMemFreeAsync", 11020, cuMemFreeAsync, 0)                                                  \
    X("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz, 1)                                             \
    X("cuMemRelease", 10020, cuMemRelease, 0)                                                      \
    X("cuArrayDestroy", 2000, cuArrayDestroy, 0)                                                   \
    X("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy, 0)                                 \
    X("cuCtxDestroy", 4000, cuCtxDestroy_v2, 0)                                                    \
    X("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2, 0)                         \
    X("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2, 0)                             \
    X("cuMemGetInfo", 3020, cuMemGetInfo_v2, 0)                                                    \
    X("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2, 0)                                            \
    X("cuLaunchKernel", 4000, cuLaunchKernel, 0)                                                   \
    X("cuLaunchKernel", 7000, cuLaunchKernel_ptsz, 1)                                              \
    X("cuLaunchKernelEx", 11060, cuLaunchKernelEx, 0)                                              \
    X("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz, 1)                                         \
    X("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel, 0)                             \
    X("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz, 1)                        \
    X("cuGraphLaunch", 10000, cuGraphLaunch, 0)                                                    \
    X("cuGraphLaunch", 10000, cuGraphLaunch_ptsz, 1)

/* the other entry points the simulated driver answers */
#define GP_PROCS_OTHER(X)                                                                          \
    X("cuInit", 2000, cuInit, 0)                                                                   \
    X("cuDriverGetVersion", 2020, cuDriverGetVersion, 0)                                           \
    X("cuGetErrorString", 6000, cuGetErrorString, 0)                                               \
    X("cuGetErrorName", 6000, cuGetErrorName, 0)                                                   \
    X("cuDeviceGetCount", 2000, cuDeviceGetCount, 0)                                               \
    X("cuDeviceGet", 2000, cuDeviceGet, 0)                                                         \
    X("cuDeviceGetName", 2000, cuDeviceGetName, 0)                                                 \
    X("cuDeviceGetUuid", 9020, cuDeviceGetUuid, 0)                                                 \
    X("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2, 0)                                             \
    X("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute, 0)                                       \
    X("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId, 0)                                         \
    X("cuDeviceComputeCapability", 2000, cuDeviceComputeCapability, 0)                             \
    X("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain, 0)                               \
    X("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState, 0)                           \
    X("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2, 0)                       \
    X("cuCtxCreate", 3020, cuCtxCreate_v2, 0)                                                      \
    X("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2, 0)                                            \
    X("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2, 0)                                              \
    X("cuCtxSetCurrent", 4000, cuCtxSetCurrent, 0)                                                 \
    X("cuCtxGetCurrent", 4000, cuCtxGetCurrent, 0)                                                 \
    X("cuCtxGetDevice", 2000, cuCtxGetDevice, 0)                                                   \
    X("cuCtxSynchronize", 2000, cuCtxSynchronize, 0)                                               \
    X("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange, 0)                         \
    X("cuStreamCreate", 2000, cuStreamCreate, 0)                                                   \
    X("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority, 0)                           \
    X("cuStreamDestroy", 4000, cuStreamDestroy_v2, 0)                                              \
    X("cuStreamGetCtx", 9020, cuStreamGetCtx, 0)                                                   \
    X("cuStreamSynchronize", 2000, cuStreamSynchronize, 0)                                         \
    X("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz, 1)                                    \
    X("cuStreamQuery", 2000, cuStreamQuery, 0)                                                     \
    X("cuStreamQuery", 7000, cuStreamQuery_ptsz, 1)                                                \
    X("cuStreamWaitEvent", 3020, cuStreamWaitEvent, 0)                                             \
    X("cuStreamWaitEvent", 7000, cuStreamWaitEvent_ptsz, 1)                                        \
    X("cuStreamBeginCapture", 10000, cuStreamBeginCapture, 0)                                      \
    X("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz, 1)                                 \
    X("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, 0)                                   \
    X("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz, 1)                              \
    X("cuStreamEndCapture", 10000, cuStreamEndCapture, 0)                                          \
    X("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz, 1)                                     \
    X("cuStreamIsCapturing", 10000, cuStreamIsCapturing, 0)                                        \
    X("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz, 1)                                   \
    X("cuEventCreate", 2000, cuEventCreate, 0)                                                     \
    X("cuEventRecord", 2000, cuEventRecord, 0)                                                     \
    X("cuEventRecord", 7000, cuEventRecord_ptsz, 1)                                                \
    X("cuEventQuery", 2000, cuEventQuery, 0)                                                       \
    X("cuEventSynchronize", 2000, cuEventSynchronize, 0)                                           \
    X("cuEventElapsedTime", 2000, cuEventElapsedTime, 0)                                           \
    X("cuEventElapsedTime", 12080, cuEventElapsedTime_v2, 0)                                       \
    X("cuEventDestroy", 4000, cuEventDestroy_v2, 0)                                                \
    X("cuModuleLoad", 2000, cuModuleLoad, 0)                                                       \
    X("cuModuleLoadData", 2000, cuModuleLoadData, 0)                                               \
    X("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx, 0)                                           \
    X("cuModuleUnload", 2000, cuModuleUnload, 0)                                                   \
    X("cuModuleGetFunction", 2000, cuModuleGetFunction, 0)                                         \
    X("cuLibraryLoadData", 12000, cuLibraryLoadData, 0)                                            \
    X("cuLibraryUnload", 12000, cuLibraryUnload, 0)                                                \
    X("cuLibraryGetKernel", 12000, cuLibraryGetKernel, 0)                                          \
    X("cuKernelGetFunction", 12000, cuKernelGetFunction, 0)                                        \
    X("cuGraphCreate", 10000, cuGraphCreate, 0)                                                    \
    X("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode, 0)                                      \
    X("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2, 0)                                   \
    X("cuGraphInstantiate", 10000, cuGraphInstantiate_v2, 0)                                       \
    X("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags, 0)                                 \
    X("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags, 0)                        \
    X("cuGraphExecDestroy", 10000, cuGraphExecDestroy, 0)                                          \
    X("cuGraphDestroy", 10000, cuGraphDestroy, 0)                                                  \
    X("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool, 0)                            \
    X("cuMemPoolCreate", 11020, cuMemPoolCreate, 0)                                                \
    X("cuMemPoolDestroy", 11020, cuMemPoolDestroy, 0)                                              \
    X("cuMemHostAlloc", 2020, cuMemHostAlloc, 0)                                                   \
    X("cuMemAllocHost", 3020, cuMemAllocHost_v2, 0)                                                \
    X("cuMemFreeHost", 2000, cuMemFreeHost, 0)                                                     \
    X("cuMemHostRegister", 6050, cuMemHostRegister_v2, 0)                                          \
    X("cuMemHostUnregister", 4000, cuMemHostUnregister, 0)                                         \
    X("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2, 0)                          \
    X("cuPointerGetAttribute", 4000, cuPointerGetAttribute, 0)                                     \
    X("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2, 0)                                    \
    X("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer, 0)                                     \
    X("cuFuncGetAttribute", 2020, cuFuncGetAttribute, 0)                                           \
    X("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,                                         \
      cuOccupancyMaxActiveBlocksPerMultiprocessor, 0)                                              \
    X("cuMemAddressReserve", 10020, cuMemAddressReserve, 0)                                        \
    X("cuMemAddressFree", 10020, cuMemAddressFree, 0)                                              \
    X("cuMemMap", 10020, cuMemMap, 0)                                                              \
    X("cuMemUnmap", 10020, cuMemUnmap, 0)                                                          \
    X("cuMemSetAccess", 10020, cuMemSetAccess, 0)                                                  \
    X("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity, 0)                    \
    X("cuMemcpy", 4000, cuMemcpy, 0)                                                               \
    X("cuMemcpy", 7000, cuMemcpy_ptds, 1)                                                          \
    X("cuMemcpyAsync", 4000, cuMemcpyAsync, 0)                                                     \
    X("cuMemcpyAsync", 7000, cuMemcpyAsync_ptsz, 1)                                                \
    X("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, 0)                                                    \
    X("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds, 1)                                               \
    X("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, 0)                                                    \
    X("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds, 1)                                               \
    X("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, 0)                                                    \
    X("cuMemcpyDtoD", 7000, cuMemcpyDtoD_v2_ptds, 1)                                               \
    X("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, 0)                                          \
    X("cuMemcpyHtoDAsync", 7000, cuMemcpyHtoDAsync_v2_ptsz, 1)                                     \
    X("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, 0)                                          \
    X("cuMemcpyDtoHAsync", 7000, cuMemcpyDtoHAsync_v2_ptsz, 1)                                     \
    X("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, 0)                                          \
    X("cuMemcpyDtoDAsync", 7000, cuMemcpyDtoDAsync_v2_ptsz, 1)                                     \
    X("cuMemsetD8", 3020, cuMemsetD8_v2, 0)                                                        \
    X("cuMemsetD8", 7000, cuMemsetD8_v2_ptds, 1)                                                   \
    X("cuMemsetD32", 3020, cuMemsetD32_v2, 0)                                                      \
    X("cuMemsetD32", 7000, cuMemsetD32_v2_ptds, 1)                                                 \
    X("cuMemsetD8Async", 3020, cuMemsetD8Async, 0)                                                 \
    X("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz, 1)                                            \
    X("cuMemsetD32Async", 3020, cuMemsetD32Async, 0)                                               \
    X("cuMemsetD32Async", 7000, cuMemsetD32Async_ptsz, 1)

#endif /* GPUPOOL_PROCS_H */
