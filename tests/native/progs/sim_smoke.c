/*
 * A CUDA driver API program in plain C: lists the GPUs, allocates, copies, launches 10 kernels
 * and times them with events. Build it against any libcuda.so.1 (real or gpupool's simulated one):
 *     gcc -o sim_smoke sim_smoke.c -ldl
 * and run it under a share:  gpupool exec --simulate 1xH100 --memory 4GiB -- ./sim_smoke
 * It loads the driver with dlopen("libcuda.so.1") so that it needs no CUDA toolkit to build.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;

static void *driver;

static void *sym(const char *name) {
    void *p = dlsym(driver, name);
    if (p == NULL) {
        fprintf(stderr, "sim_smoke: the driver has no %s\n", name);
        exit(3);
    }
    return p;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "sim_smoke: %s failed: CUDA error %d\n", #call, rc_);                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void) {
    driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver == NULL) {
        fprintf(stderr, "sim_smoke: cannot load libcuda.so.1: %s\n", dlerror());
        return 3;
    }
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = sym("cuDeviceTotalMem_v2");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = sym("cuMemcpyHtoD_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym("cuModuleGetFunction");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **) =
        sym("cuLaunchKernel");
    CUresult (*cuEventCreate)(CUevent *, unsigned) = sym("cuEventCreate");
    CUresult (*cuEventRecord)(CUevent, CUstream) = sym("cuEventRecord");
    CUresult (*cuEventSynchronize)(CUevent) = sym("cuEventSynchronize");
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent) = sym("cuEventElapsedTime");

    CHECK(cuInit(0));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        char name[128];
        size_t total = 0;
        CHECK(cuDeviceGet(&dev, i));
        CHECK(cuDeviceGetName(name, sizeof name, dev));
        CHECK(cuDeviceTotalMem(&total, dev));
        printf("GPU %d: %s, %zu MiB\n", i, name, total >> 20);
    }
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    size_t free_b = 0, total_b = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    printf("memory: %zu MiB free of %zu MiB\n", free_b >> 20, total_b >> 20);

    const size_t n = 1 << 20;
    char *host = malloc(n), *back = malloc(n);
    memset(host, 0x5a, n);
    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, n));
    CHECK(cuMemcpyHtoD(buf, host, n));
    CHECK(cuMemcpyDtoH(back, buf, n));
    printf("copy round trip: %s\n", memcmp(host, back, n) == 0 ? "ok" : "MISMATCH");

    static const char image[] = "any module image";
    CUmodule mod;
    CUfunction fn;
    CUevent start, stop;
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&fn, mod, "kernel"));
    CHECK(cuEventCreate(&start, 0));
    CHECK(cuEventCreate(&stop, 0));
    CHECK(cuEventRecord(start, NULL));
    for (int i = 0; i < 10; i++)
        CHECK(cuLaunchKernel(fn, 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuEventRecord(stop, NULL));
    CHECK(cuEventSynchronize(stop));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, start, stop));
    printf("10 kernels of 256x128 threads: %.2f ms\n", ms);
    CHECK(cuMemFree(buf));
    free(host);
    free(back);
    return 0;
}
