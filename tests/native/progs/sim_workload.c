/*
 * A small CUDA workload for tests/test_integration_sim.py, run under `gpupool exec`: it holds
 * 1 GiB, tries an allocation past its share, launches kernels until SIGUSR1, then sleeps until
 * it is killed. Built against native/include/gpupool_cuda.h and linked with libcuda.so.1.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpupool_cuda.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            printf("error call=%s rc=%d\n", #call, (int)rc_);                                      \
            exit(10);                                                                              \
        }                                                                                          \
    } while (0)

static volatile sig_atomic_t stop_launching;

static void on_usr1(int sig) {
    (void)sig;
    stop_launching = 1;
}

int main(int argc, char **argv) {
    unsigned long long past = argc > 1 ? strtoull(argv[1], NULL, 10) : 4ull << 30;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGUSR1, on_usr1);
    CUcontext ctx;
    CUdeviceptr held, more;
    CUmodule mod;
    CUfunction fn;
    static const char image[] = "not a real cubin: the simulation runs no device code";
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemAlloc_v2(&held, 1ull << 30));
    printf("alloc size=%llu rc=%d\n", past, (int)cuMemAlloc_v2(&more, past));
    CK(cuModuleLoadData(&mod, image));
    CK(cuModuleGetFunction(&fn, mod, "workload"));
    printf("ready pid=%d\n", (int)getpid());
    while (!stop_launching) {
        for (int i = 0; i < 10; i++) /* 1 ms each */
            CK(cuLaunchKernel(fn, 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize());
    }
    printf("sleeping\n");
    for (;;) pause();
}
