/*
 * A latency-bound service for the priority tests: one request at a time, each KERNELS launches
 * of BLOCKS blocks of 128 threads then a synchronize, with GAP_US of host time between requests
 * (what a small model's server does between requests), for SECONDS of wall time.
 *   request_loop SECONDS KERNELS BLOCKS GAP_US
 *   -> "requests COUNT P50_NS P99_NS MAX_NS ELAPSED_NS"
 * Built against native/include/gpupool_cuda.h and linked with libcuda.so.1.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpupool_cuda.h"

#define MAX_REQUESTS 200000

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            fprintf(stderr, "request_loop: %s failed with %d\n", #call, (int)rc_);                 \
            exit(4);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t latencies[MAX_REQUESTS];

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: request_loop SECONDS KERNELS BLOCKS GAP_US\n");
        return 2;
    }
    double seconds = strtod(argv[1], NULL);
    int kernels = atoi(argv[2]);
    unsigned blocks = (unsigned)atoi(argv[3]);
    uint64_t gap_ns = strtoull(argv[4], NULL, 10) * 1000ull;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    static const char image[] = "not a real cubin: the simulation runs no device code";
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, image));
    CK(cuModuleGetFunction(&fn, mod, "request"));
    uint64_t start = now_ns(), until = start + (uint64_t)(seconds * 1e9);
    size_t count = 0;
    while (now_ns() < until && count < MAX_REQUESTS) {
        uint64_t begin = now_ns();
        for (int k = 0; k < kernels; k++)
            CK(cuLaunchKernel(fn, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize());
        latencies[count++] = now_ns() - begin;
        sleep_ns(gap_ns);
    }
    uint64_t elapsed = now_ns() - start;
    qsort(latencies, count, sizeof latencies[0], by_value);
    size_t p99 = count * 99 / 100;
    printf("requests %zu %llu %llu %llu %llu\n", count, (unsigned long long)latencies[count / 2],
           (unsigned long long)latencies[p99], (unsigned long long)latencies[count - 1],
           (unsigned long long)elapsed);
    return 0;
}
