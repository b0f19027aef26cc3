/*
 * A driver that does nothing, quickly: the entry points bench/isolation_overhead.c calls, each
 * returning at once. Timing the benchmark on it with and without the interception library gives
 * the library's own cost per call, free of the simulated driver's mmap and locking noise. Events,
 * a UUID and a stream's capture status are there too, so that a share with a priority engages
 * the compute arbiter (its lease and event timing of every batch) on this driver as well; every
 * event is complete at once and no time passes between two.
 */
#include <stdint.h>

#include "gpupool_cuda.h"

static CUdeviceptr next_ptr = 0x100000000ull;

CUresult cuInit(unsigned int flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    *device = ordinal;
    return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    (void)dev;
    *pctx = (CUcontext)(uintptr_t)0x1000;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    *pctx = (CUcontext)(uintptr_t)0x1000;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    (void)dev;
    *bytes = 80ull << 30;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    (void)image;
    *module = (CUmodule)(uintptr_t)0x2000;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    (void)hmod;
    (void)name;
    *hfunc = (CUfunction)(uintptr_t)0x3000;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    *dptr = next_ptr;
    next_ptr += (bytesize + 4095) & ~(size_t)4095;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY;
    (void)blockDimZ, (void)sharedMemBytes, (void)hStream, (void)kernelParams, (void)extra;
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    for (int i = 0; i < 16; i++) uuid->bytes[i] = (char)(0xa0 + i);
    return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static uintptr_t next_event = 0x4000;

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    (void)Flags;
    *phEvent = (CUevent)next_event;
    next_event += 16;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) { return hEvent ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    (void)hStream;
    return hEvent ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventQuery(CUevent hEvent) { return hEvent ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

CUresult cuEventSynchronize(CUevent hEvent) {
    return hEvent ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    *pMilliseconds = 0.0f;
    return hStart && hEnd ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    (void)hStream;
    *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
