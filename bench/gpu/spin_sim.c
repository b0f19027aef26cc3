/*
 * The compute check's stand-in on the simulated driver (`compute_together.py --simulate`): the
 * same command line and output as spin.cu, through the driver API (the simulated driver has no
 * CUDA runtime). A simulated kernel lasts GPUPOOL_SIM_KERNEL_NS, which the script sets to MS.
 *
 *   spin_sim MS SECONDS [alloc|async|requests]
 *
 * `async` launches without waiting for each kernel (as PyTorch does), synchronizing at the end;
 * `requests` serves one request at a time (a kernel, then a synchronize) with MS of idle time
 * between requests, and adds the 99th percentile of the request latencies ("p99_ms"). Every run
 * gives its start and end on CLOCK_MONOTONIC ("start", "end", seconds) and, every 50 ms, how
 * many kernels it had launched ("marks": [time, count]), so that another workload's time can be
 * cut out of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpupool_cuda.h"

#define MAX_REQUESTS 200000
#define MAX_MARKS 20000
#define MARK_EVERY_S 0.05

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

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
    int async = strcmp(mode, "async") == 0, requests = strcmp(mode, "requests") == 0;
    static double latency[MAX_REQUESTS];
    static double mark_time[MAX_MARKS];
    static long mark_count[MAX_MARKS];
    int marks = 0;
    double start = now_s();
    long kernels = 0;
    while (now_s() - start < seconds) {
        if (marks < MAX_MARKS && (marks == 0 || now_s() - mark_time[marks - 1] >= MARK_EVERY_S)) {
            mark_time[marks] = now_s();
            mark_count[marks++] = kernels;
        }
        double asked = now_s();
        check(cuLaunchKernel(fn, 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), "cuLaunchKernel");
        if (!async) check(cuCtxSynchronize(), "cuCtxSynchronize");
        if (requests && kernels < MAX_REQUESTS) {
            latency[kernels] = (now_s() - asked) * 1e3;
            struct timespec idle = {0, (long)(ms * 1e6)};
            nanosleep(&idle, NULL);
        }
        kernels++;
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    double end = now_s(), elapsed = end - start, p99 = 0;
    long n = kernels < MAX_REQUESTS ? kernels : MAX_REQUESTS;
    if (requests && n > 0) {
        qsort(latency, (size_t)n, sizeof latency[0], by_value);
        p99 = latency[(long)(0.99 * (double)(n - 1))];
    }
    printf("RESULT {\"kernels\": %ld, \"seconds\": %.6f, \"ms\": %g, \"p99_ms\": %.4f, "
           "\"start\": %.6f, \"end\": %.6f, \"marks\": [",
           kernels, elapsed, ms, p99, start, end);
    for (int i = 0; i < marks; i++)
        printf("%s[%.6f, %ld]", i ? ", " : "", mark_time[i], mark_count[i]);
    printf("]}\n");
    return 0;
}
