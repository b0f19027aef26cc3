/*
 * Times intercepted driver calls on the simulated driver (bench/isolation_overhead.py runs it with
 * and without the interception library preloaded). Linked to libcuda.so.1 directly, so with
 * LD_PRELOAD the calls bind to the library's wrappers, as they do in a workload.
 * Usage: isolation_overhead CALLS ROUNDS [LOOP_LAUNCHES]; prints "NAME NS_PER_CALL" lines (best
 * round). CALLS allocations are alive at once; the launch-bound loop runs LOOP_LAUNCHES launches
 * (default CALLS).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpupool_cuda.h"

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void check(CUresult rc, const char *what) {
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "isolation_overhead: %s failed with %d\n", what, (int)rc);
        exit(1);
    }
}

static double best(double current, double candidate) {
    return current < 0 || candidate < current ? candidate : current;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: isolation_overhead CALLS ROUNDS [LOOP_LAUNCHES]\n");
        return 2;
    }
    int calls = atoi(argv[1]), rounds = atoi(argv[2]);
    int loop_launches = argc == 4 ? atoi(argv[3]) : calls;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction fn;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuModuleLoadData(&module, "bench"), "cuModuleLoadData");
    check(cuModuleGetFunction(&fn, module, "tiny"), "cuModuleGetFunction");
    CUdeviceptr *ptrs = calloc((size_t)calls, sizeof *ptrs);
    double alloc = -1, release = -1, launch = -1, loop = -1;
    for (int round = 0; round < rounds; round++) {
        unsigned long long t0 = now_ns();
        for (int i = 0; i < calls; i++) check(cuMemAlloc_v2(&ptrs[i], 4096), "cuMemAlloc_v2");
        unsigned long long t1 = now_ns();
        for (int i = 0; i < calls; i++) check(cuMemFree_v2(ptrs[i]), "cuMemFree_v2");
        unsigned long long t2 = now_ns();
        /* a one-thread kernel: the launch call's own cost is all there is to time */
        for (int i = 0; i < calls; i++)
            check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), "cuLaunchKernel");
        unsigned long long t3 = now_ns();
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        /* a launch-bound loop: launch, and synchronise every 64 launches, as a training step */
        unsigned long long t4 = now_ns();
        for (int i = 0; i < loop_launches; i++) {
            check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), "cuLaunchKernel");
            if (i % 64 == 63) check(cuCtxSynchronize(), "cuCtxSynchronize");
        }
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        unsigned long long t5 = now_ns();
        alloc = best(alloc, (double)(t1 - t0) / calls);
        release = best(release, (double)(t2 - t1) / calls);
        launch = best(launch, (double)(t3 - t2) / calls);
        loop = best(loop, (double)(t5 - t4) / loop_launches);
    }
    printf("alloc %.1f\nfree %.1f\nlaunch %.1f\nloop %.1f\n", alloc, release, launch, loop);
    free(ptrs);
    return 0;
}
