/*
 * An escape from the interception library for tests/agent/test_watchdog.py: it fetches the C
 * library's own dlsym with dlvsym (which the library does not answer), then the driver's real
 * entry points with it, and allocates MIB MiB on device 0 past any share. Holds it SECONDS.
 * Usage: escape_dlvsym MIB SECONDS
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpupool_cuda.h"

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym(void) {
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        dlsym_fn fn = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
        if (fn != NULL) return fn;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: escape_dlvsym MIB SECONDS\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    dlsym_fn find = real_dlsym();
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (find == NULL || driver == NULL) {
        fprintf(stderr, "no dlsym or no driver: %s\n", dlerror());
        return 3;
    }
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))find(driver, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))find(driver, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult (*)(CUcontext))find(driver, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult (*)(CUdeviceptr *, size_t))find(driver, "cuMemAlloc_v2");
    CUcontext ctx;
    CUdeviceptr ptr;
    CUresult rc = init(0);
    if (rc == CUDA_SUCCESS) rc = retain(&ctx, 0);
    if (rc == CUDA_SUCCESS) rc = set_current(ctx);
    if (rc == CUDA_SUCCESS) rc = alloc(&ptr, bytes);
    printf("escape_dlvsym: %s MiB: CUDA error %d\n", argv[1], (int)rc);
    fflush(stdout);
    if (rc != CUDA_SUCCESS) return 1;
    sleep((unsigned)atoi(argv[2]));
    return 0;
}
