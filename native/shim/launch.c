/* The launch entry points: each passes through the compute throttle (throttle.c). */
#include "shim.h"

#define THROTTLED(real_name, stream, ptsz, call)                                                \
    do {                                                                                      \
        __typeof__(&real_name) real = GP_REAL(real_name);                                     \
        if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;                                  \
        gp_launch launch;                                                                     \
        gp_throttle_before(&launch, (stream), (ptsz));                                        \
        CUresult rc = real call;                                                              \
        gp_throttle_after(&launch, rc);                                                       \
        return rc;                                                                            \
    } while (0)

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    THROTTLED(cuLaunchKernel, hStream, 0,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams, extra));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra) {
    THROTTLED(cuLaunchKernel_ptsz, hStream, 1,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    THROTTLED(cuLaunchKernelEx, config ? config->hStream : NULL, 0,
              (config, f, kernelParams, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra) {
    THROTTLED(cuLaunchKernelEx_ptsz, config ? config->hStream : NULL, 1,
              (config, f, kernelParams, extra));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams) {
    THROTTLED(cuLaunchCooperativeKernel, hStream, 0,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void **kernelParams) {
    THROTTLED(cuLaunchCooperativeKernel_ptsz, hStream, 1,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams));
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    THROTTLED(cuGraphLaunch, hStream, 0, (hGraphExec, hStream));
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    THROTTLED(cuGraphLaunch_ptsz, hStream, 1, (hGraphExec, hStream));
}
