/*
 * The compute check's stand-in on the simulated driver (`compute_together.py --simulate`): the
 * same command line and output as spin.cu, through the driver API (the simulated driver has no
 * CUDA runtime). A simulated kernel lasts GPUPOOL_SIM_KERNEL_NS, which the script sets to MS.
 *
 *   spin_sim MS SECONDS [alloc|async]
 *
 * `async` launches without waiting for each kernel (as PyTorch does), synchronizing at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpupool_cuda.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(CUresult rc, const char *what) {
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "spin_sim: %s failed with %d\n", what, (int)rc);
        exit(3);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spin_sim MS SECONDS [alloc|async]\n");
        return 64;
    }
    double ms = atof(argv[1]), seconds = atof(argv[2]);
    const char *mode = argc > 3 ? argv[3] : "";
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction fn;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuModuleLoadData(&module, "spin"), "cuModuleLoadData");
    check(cuModuleGetFunction(&fn, module, "spin"), "cuModuleGetFunction");
    if (strcmp(mode, "alloc") == 0) {
        CUdeviceptr p;
        check(cuMemAlloc_v2(&p, 64 << 20), "cuMemAlloc");
    }
    int async = strcmp(mode, "async") == 0;
    double start = now_s();
    long kernels = 0;
    while (now_s() - start < seconds) {
        check(cuLaunchKernel(fn, 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), "cuLaunchKernel");
        if (!async) check(cuCtxSynchronize(), "cuCtxSynchronize");
        kernels++;
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    printf("RESULT {\"kernels\": %ld, \"seconds\": %.6f, \"ms\": %g}\n", kernels, now_s() - start,
           ms);
    return 0;
}
