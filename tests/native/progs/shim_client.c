/*
 * A CUDA driver API client for the interception library's tests. It loads the driver by name
 * (dlopen + dlsym, as the CUDA runtime and ctypes do) and runs the steps given as arguments, one
 * output line per step:
 *   alloc BYTES          cuMemAlloc_v2                    -> "alloc RC"
 *   procalloc BYTES      cuMemAlloc via cuGetProcAddress  -> "procalloc RC"
 *   managed BYTES        cuMemAllocManaged                -> "managed RC"
 *   pitch WIDTH HEIGHT   cuMemAllocPitch_v2               -> "pitch RC PITCH"
 *   async BYTES          cuMemAllocAsync (+ stream sync)  -> "async RC"
 *   vmm BYTES            cuMemCreate on device 0          -> "vmm RC"
 *   array W H            cuArrayCreate_v2 (float4)        -> "array RC"
 *   array3d W H D        cuArray3DCreate_v2 (float4)      -> "array3d RC"
 *   mipmap W H LEVELS    cuMipmappedArrayCreate (float4)  -> "mipmap RC"
 *   pool BYTES           cuMemAllocFromPoolAsync, the device's default pool -> "pool RC"
 *   ptszasync BYTES      cuMemAllocAsync fetched by cuGetProcAddress with the per-thread
 *                        default stream flag (the _ptsz flavour) -> "ptszasync RC"
 *   free                 frees the latest allocation      -> "free RC"
 *   freeasync            cuMemFreeAsync of the latest     -> "freeasync RC"
 *   ptszfree             cuMemFreeAsync, _ptsz flavour    -> "ptszfree RC"
 *   fill BYTES           cuMemAlloc until it fails        -> "fill COUNT RC"
 *   meminfo              cuMemGetInfo_v2                  -> "meminfo FREE TOTAL"
 *   totalmem             cuDeviceTotalMem_v2              -> "totalmem BYTES"
 *   run SECONDS KIND     launches for SECONDS of wall time, then synchronizes; KIND is kernel,
 *                        ex, coop, graph, procgraph (cuGraphLaunch via cuGetProcAddress with
 *                        the per-thread stream flavour), or nocurrent (cuLaunchKernel on a stream
 *                        of the context, while no context is current on the thread)
 *                        -> "run LAUNCHES ELAPSED_NS"
 *   exporttable          cuGetExportTable of an id of 16 bytes 0x01..0x10 -> "exporttable RC"
 *   ready                prints "ready" and waits for a line on stdin
 *   hold                 prints "holding" and sleeps until killed
 *   exec STEPS...        replaces itself (same pid) with a new client running STEPS
 *   ctxdestroy BYTES     allocates BYTES in a new context, destroys it without freeing, and makes
 *                        the primary context current again -> "ctxdestroy RC"
 *   reset BYTES          allocates BYTES in the primary context, resets it without freeing, and
 *                        retains it again -> "reset RC"
 *   churn BYTES          prints "churning", then allocates and frees BYTES forever
 *   tfill THREADS BYTES  THREADS threads allocate BYTES until it fails, then (all full) free
 *                        -> "tfill COUNT FREE_RC_NONZERO"
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpupool_cuda.h"

#define FN(name) static __typeof__(&name) p_##name
FN(cuInit);
FN(cuDeviceGet);
FN(cuDevicePrimaryCtxRetain);
FN(cuCtxSetCurrent);
FN(cuCtxSynchronize);
FN(cuCtxCreate_v2);
FN(cuCtxDestroy_v2);
FN(cuDevicePrimaryCtxReset_v2);
FN(cuGetProcAddress_v2);
FN(cuMemAlloc_v2);
FN(cuMemAllocManaged);
FN(cuMemAllocPitch_v2);
FN(cuMemAllocAsync);
FN(cuMemFree_v2);
FN(cuMemFreeAsync);
FN(cuMemCreate);
FN(cuMemRelease);
FN(cuArrayCreate_v2);
FN(cuArrayDestroy);
FN(cuArray3DCreate_v2);
FN(cuMipmappedArrayCreate);
FN(cuMipmappedArrayDestroy);
FN(cuDeviceGetDefaultMemPool);
FN(cuMemAllocFromPoolAsync);
FN(cuMemGetInfo_v2);
FN(cuDeviceTotalMem_v2);
FN(cuStreamSynchronize);
FN(cuStreamCreate);
FN(cuGetExportTable);
FN(cuCtxGetCurrent);
FN(cuModuleLoadData);
FN(cuModuleGetFunction);
FN(cuLaunchKernel);
FN(cuLaunchKernelEx);
FN(cuLaunchCooperativeKernel);
FN(cuGraphCreate);
FN(cuGraphAddKernelNode);
FN(cuGraphInstantiateWithFlags);
FN(cuGraphLaunch);
FN(cuGraphDestroy);
FN(cuGraphExecDestroy);

static void *load(void *lib, const char *name) {
    void *fn = dlsym(lib, name);
    if (fn == NULL) {
        fprintf(stderr, "shim_client: no %s in the driver\n", name);
        exit(3);
    }
    return fn;
}

#define LOAD(name) p_##name = (__typeof__(&name))load(lib, #name)

static void load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "shim_client: %s\n", dlerror());
        exit(3);
    }
    LOAD(cuInit);
    LOAD(cuDeviceGet);
    LOAD(cuDevicePrimaryCtxRetain);
    LOAD(cuCtxSetCurrent);
    LOAD(cuCtxSynchronize);
    LOAD(cuCtxCreate_v2);
    LOAD(cuCtxDestroy_v2);
    LOAD(cuDevicePrimaryCtxReset_v2);
    LOAD(cuGetProcAddress_v2);
    LOAD(cuMemAlloc_v2);
    LOAD(cuMemAllocManaged);
    LOAD(cuMemAllocPitch_v2);
    LOAD(cuMemAllocAsync);
    LOAD(cuMemFree_v2);
    LOAD(cuMemFreeAsync);
    LOAD(cuMemCreate);
    LOAD(cuMemRelease);
    LOAD(cuArrayCreate_v2);
    LOAD(cuArrayDestroy);
    LOAD(cuArray3DCreate_v2);
    LOAD(cuMipmappedArrayCreate);
    LOAD(cuMipmappedArrayDestroy);
    LOAD(cuDeviceGetDefaultMemPool);
    LOAD(cuMemAllocFromPoolAsync);
    LOAD(cuMemGetInfo_v2);
    LOAD(cuDeviceTotalMem_v2);
    LOAD(cuStreamSynchronize);
    LOAD(cuStreamCreate);
    LOAD(cuGetExportTable);
    LOAD(cuCtxGetCurrent);
    LOAD(cuModuleLoadData);
    LOAD(cuModuleGetFunction);
    LOAD(cuLaunchKernel);
    LOAD(cuLaunchKernelEx);
    LOAD(cuLaunchCooperativeKernel);
    LOAD(cuGraphCreate);
    LOAD(cuGraphAddKernelNode);
    LOAD(cuGraphInstantiateWithFlags);
    LOAD(cuGraphLaunch);
    LOAD(cuGraphDestroy);
    LOAD(cuGraphExecDestroy);
}

static void check(CUresult rc, const char *what) {
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "shim_client: %s failed with %d\n", what, (int)rc);
        exit(4);
    }
}

typedef enum { K_PTR, K_VMM, K_ARRAY, K_MIPMAP } kind_t;
typedef struct {
    kind_t kind;
    unsigned long long handle;
} alloc_t;

static alloc_t allocs[1 << 16];
static int nallocs;

static void remember(kind_t kind, unsigned long long handle) {
    if (nallocs < (int)(sizeof allocs / sizeof allocs[0]))
        allocs[nallocs++] = (alloc_t){kind, handle};
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUfunction kernel(void) {
    static CUmodule module;
    static CUfunction fn;
    if (fn == NULL) {
        static const char image[] = "shim_client kernel image";
        check(p_cuModuleLoadData(&module, image), "cuModuleLoadData");
        check(p_cuModuleGetFunction(&fn, module, "spin"), "cuModuleGetFunction");
    }
    return fn;
}

/* a graph of 4 chained kernels of 64 blocks: as long as one 256-block kernel */
static CUgraphExec graph(void) {
    CUgraph g;
    CUgraphExec exec;
    check(p_cuGraphCreate(&g, 0), "cuGraphCreate");
    CUgraphNode prev = NULL;
    for (int i = 0; i < 4; i++) {
        CUDA_KERNEL_NODE_PARAMS_v1 params = {.func = kernel(),
                                             .gridDimX = 64,
                                             .gridDimY = 1,
                                             .gridDimZ = 1,
                                             .blockDimX = 128,
                                             .blockDimY = 1,
                                             .blockDimZ = 1};
        CUgraphNode node;
        check(p_cuGraphAddKernelNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &params),
              "cuGraphAddKernelNode");
        prev = node;
    }
    check(p_cuGraphInstantiateWithFlags(&exec, g, 0), "cuGraphInstantiateWithFlags");
    check(p_cuGraphDestroy(g), "cuGraphDestroy");
    return exec;
}

static CUresult launch_once(const char *kind, CUgraphExec exec,
                            CUresult (*graph_launch)(CUgraphExec, CUstream), CUstream stream) {
    if (strcmp(kind, "nocurrent") == 0)
        return p_cuLaunchKernel(kernel(), 256, 1, 1, 128, 1, 1, 0, stream, NULL, NULL);
    if (strcmp(kind, "kernel") == 0)
        return p_cuLaunchKernel(kernel(), 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    if (strcmp(kind, "coop") == 0)
        return p_cuLaunchCooperativeKernel(kernel(), 256, 1, 1, 128, 1, 1, 0, NULL, NULL);
    if (strcmp(kind, "ex") == 0) {
        CUlaunchConfig config = {.gridDimX = 256,
                                 .gridDimY = 1,
                                 .gridDimZ = 1,
                                 .blockDimX = 128,
                                 .blockDimY = 1,
                                 .blockDimZ = 1};
        return p_cuLaunchKernelEx(&config, kernel(), NULL, NULL);
    }
    return graph_launch(exec, NULL);
}

static void run(double seconds, const char *kind) {
    CUgraphExec exec = NULL;
    CUresult (*graph_launch)(CUgraphExec, CUstream) = p_cuGraphLaunch;
    if (strcmp(kind, "graph") == 0 || strcmp(kind, "procgraph") == 0) exec = graph();
    if (strcmp(kind, "procgraph") == 0) {
        void *fn = NULL;
        check(p_cuGetProcAddress_v2("cuGraphLaunch", &fn, 12040,
                                    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL),
              "cuGetProcAddress_v2");
        graph_launch = (CUresult (*)(CUgraphExec, CUstream))fn;
    }
    kernel();
    CUstream stream = NULL;
    CUcontext ctx = NULL;
    if (strcmp(kind, "nocurrent") == 0) {
        check(p_cuStreamCreate(&stream, 0), "cuStreamCreate");
        check(p_cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
        check(p_cuCtxSetCurrent(NULL), "cuCtxSetCurrent");
    }
    uint64_t start = now_ns(), until = start + (uint64_t)(seconds * 1e9);
    unsigned long long launches = 0;
    while (now_ns() < until) {
        check(launch_once(kind, exec, graph_launch, stream), "launch");
        launches++;
    }
    if (ctx != NULL) check(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(p_cuCtxSynchronize(), "cuCtxSynchronize");
    if (exec != NULL) check(p_cuGraphExecDestroy(exec), "cuGraphExecDestroy");
    printf("run %llu %llu\n", launches, (unsigned long long)(now_ns() - start));
}

static void *proc(const char *name, cuuint64_t flags) {
    void *fn = NULL;
    check(p_cuGetProcAddress_v2(name, &fn, 12040, flags, NULL), "cuGetProcAddress_v2");
    return fn;
}

/* async: 0 cuMemFree, 1 cuMemFreeAsync, 2 cuMemFreeAsync_ptsz (by cuGetProcAddress) */
typedef struct {
    CUcontext ctx;
    pthread_barrier_t *filled; /* nobody frees before everyone has hit the limit */
    size_t bytes;
    unsigned long long count;
    int free_errors;
} tfill_t;

static void *tfill_thread(void *arg) {
    tfill_t *job = arg;
    check(p_cuCtxSetCurrent(job->ctx), "cuCtxSetCurrent");
    CUdeviceptr *ptrs = NULL;
    size_t cap = 0;
    CUdeviceptr ptr;
    while (p_cuMemAlloc_v2(&ptr, job->bytes) == CUDA_SUCCESS) {
        if (job->count == cap) {
            cap = cap ? cap * 2 : 64;
            ptrs = realloc(ptrs, cap * sizeof *ptrs);
        }
        ptrs[job->count++] = ptr;
    }
    pthread_barrier_wait(job->filled);
    for (unsigned long long i = 0; i < job->count; i++)
        job->free_errors += p_cuMemFree_v2(ptrs[i]) != CUDA_SUCCESS;
    free(ptrs);
    return NULL;
}

static void tfill(CUcontext ctx, int threads, size_t bytes) {
    pthread_t ids[64];
    tfill_t jobs[64];
    pthread_barrier_t filled;
    if (threads > 64) threads = 64;
    pthread_barrier_init(&filled, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        jobs[i] = (tfill_t){.ctx = ctx, .filled = &filled, .bytes = bytes};
        pthread_create(&ids[i], NULL, tfill_thread, &jobs[i]);
    }
    unsigned long long count = 0;
    int errors = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], NULL);
        count += jobs[i].count;
        errors += jobs[i].free_errors;
    }
    pthread_barrier_destroy(&filled);
    printf("tfill %llu %d\n", count, errors);
}

static CUresult free_latest(int async) {
    if (nallocs == 0) return CUDA_ERROR_INVALID_VALUE;
    alloc_t a = allocs[--nallocs];
    switch (a.kind) {
    case K_VMM: return p_cuMemRelease(a.handle);
    case K_ARRAY: return p_cuArrayDestroy((CUarray)(uintptr_t)a.handle);
    case K_MIPMAP: return p_cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)a.handle);
    default: break;
    }
    if (async == 2) {
        __typeof__(&cuMemFreeAsync) free_ptsz = (__typeof__(&cuMemFreeAsync))proc(
            "cuMemFreeAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        return free_ptsz(a.handle, NULL);
    }
    return async ? p_cuMemFreeAsync(a.handle, NULL) : p_cuMemFree_v2(a.handle);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    load_driver();
    CUdevice dev;
    CUcontext ctx;
    check(p_cuInit(0), "cuInit");
    check(p_cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(p_cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    for (int i = 1; i < argc; i++) {
        const char *step = argv[i];
        const char *arg = i + 1 < argc ? argv[i + 1] : "0";
        unsigned long long n = strtoull(arg, NULL, 0);
        CUdeviceptr ptr = 0;
        CUresult rc;
        if (strcmp(step, "alloc") == 0 || strcmp(step, "procalloc") == 0) {
            __typeof__(&cuMemAlloc_v2) alloc = p_cuMemAlloc_v2;
            if (strcmp(step, "procalloc") == 0) {
                void *fn = NULL;
                check(p_cuGetProcAddress_v2("cuMemAlloc", &fn, 12040, 0, NULL), "cuGetProcAddress");
                alloc = (__typeof__(&cuMemAlloc_v2))fn;
            }
            rc = alloc(&ptr, n);
            if (rc == CUDA_SUCCESS) remember(K_PTR, ptr);
            printf("%s %d\n", step, (int)rc);
            i++;
        } else if (strcmp(step, "managed") == 0) {
            rc = p_cuMemAllocManaged(&ptr, n, CU_MEM_ATTACH_GLOBAL);
            if (rc == CUDA_SUCCESS) remember(K_PTR, ptr);
            printf("managed %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "async") == 0) {
            rc = p_cuMemAllocAsync(&ptr, n, NULL);
            if (rc == CUDA_SUCCESS) {
                remember(K_PTR, ptr);
                check(p_cuStreamSynchronize(NULL), "cuStreamSynchronize");
            }
            printf("async %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "pitch") == 0) {
            size_t pitch = 0, height = strtoull(argv[i + 2], NULL, 0);
            rc = p_cuMemAllocPitch_v2(&ptr, &pitch, n, height, 4);
            if (rc == CUDA_SUCCESS) remember(K_PTR, ptr);
            printf("pitch %d %zu\n", (int)rc, pitch);
            i += 2;
        } else if (strcmp(step, "vmm") == 0) {
            CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
            CUmemGenericAllocationHandle handle = 0;
            rc = p_cuMemCreate(&handle, n, &prop, 0);
            if (rc == CUDA_SUCCESS) remember(K_VMM, handle);
            printf("vmm %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "array") == 0) {
            CUDA_ARRAY_DESCRIPTOR desc = {.Width = n,
                                          .Height = strtoull(argv[i + 2], NULL, 0),
                                          .Format = CU_AD_FORMAT_FLOAT,
                                          .NumChannels = 4};
            CUarray array = NULL;
            rc = p_cuArrayCreate_v2(&array, &desc);
            if (rc == CUDA_SUCCESS) remember(K_ARRAY, (uintptr_t)array);
            printf("array %d\n", (int)rc);
            i += 2;
        } else if (strcmp(step, "array3d") == 0 || strcmp(step, "mipmap") == 0) {
            CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = n,
                                            .Height = strtoull(argv[i + 2], NULL, 0),
                                            .Format = CU_AD_FORMAT_FLOAT,
                                            .NumChannels = 4};
            unsigned int third = (unsigned int)strtoul(argv[i + 3], NULL, 0);
            if (strcmp(step, "array3d") == 0) {
                desc.Depth = third;
                CUarray array = NULL;
                rc = p_cuArray3DCreate_v2(&array, &desc);
                if (rc == CUDA_SUCCESS) remember(K_ARRAY, (uintptr_t)array);
            } else {
                CUmipmappedArray mipmap = NULL;
                rc = p_cuMipmappedArrayCreate(&mipmap, &desc, third);
                if (rc == CUDA_SUCCESS) remember(K_MIPMAP, (uintptr_t)mipmap);
            }
            printf("%s %d\n", step, (int)rc);
            i += 3;
        } else if (strcmp(step, "pool") == 0) {
            CUmemoryPool pool = NULL;
            check(p_cuDeviceGetDefaultMemPool(&pool, dev), "cuDeviceGetDefaultMemPool");
            rc = p_cuMemAllocFromPoolAsync(&ptr, n, pool, NULL);
            if (rc == CUDA_SUCCESS) {
                remember(K_PTR, ptr);
                check(p_cuStreamSynchronize(NULL), "cuStreamSynchronize");
            }
            printf("pool %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "ptszasync") == 0) {
            __typeof__(&cuMemAllocAsync) alloc_ptsz = (__typeof__(&cuMemAllocAsync))proc(
                "cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
            rc = alloc_ptsz(&ptr, n, NULL);
            if (rc == CUDA_SUCCESS) remember(K_PTR, ptr);
            printf("ptszasync %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "free") == 0 || strcmp(step, "freeasync") == 0 ||
                   strcmp(step, "ptszfree") == 0) {
            int how = strcmp(step, "free") == 0 ? 0 : strcmp(step, "freeasync") == 0 ? 1 : 2;
            printf("%s %d\n", step, (int)free_latest(how));
        } else if (strcmp(step, "fill") == 0) {
            unsigned long long count = 0;
            while ((rc = p_cuMemAlloc_v2(&ptr, n)) == CUDA_SUCCESS) {
                remember(K_PTR, ptr);
                count++;
            }
            printf("fill %llu %d\n", count, (int)rc);
            i++;
        } else if (strcmp(step, "meminfo") == 0) {
            size_t free_bytes = 0, total = 0;
            check(p_cuMemGetInfo_v2(&free_bytes, &total), "cuMemGetInfo_v2");
            printf("meminfo %zu %zu\n", free_bytes, total);
        } else if (strcmp(step, "totalmem") == 0) {
            size_t total = 0;
            check(p_cuDeviceTotalMem_v2(&total, dev), "cuDeviceTotalMem_v2");
            printf("totalmem %zu\n", total);
        } else if (strcmp(step, "run") == 0) {
            run(strtod(arg, NULL), argv[i + 2]);
            i += 2;
        } else if (strcmp(step, "exporttable") == 0) {
            CUuuid id;
            for (int b = 0; b < 16; b++) id.bytes[b] = (char)(b + 1);
            const void *table = NULL;
            printf("exporttable %d\n", (int)p_cuGetExportTable(&table, &id));
        } else if (strcmp(step, "ready") == 0) {
            printf("ready\n");
            char line[16];
            if (fgets(line, sizeof line, stdin) == NULL) return 0;
        } else if (strcmp(step, "ctxdestroy") == 0) {
            CUcontext other = NULL;
            check(p_cuCtxCreate_v2(&other, 0, dev), "cuCtxCreate_v2");
            check(p_cuMemAlloc_v2(&ptr, n), "cuMemAlloc_v2");
            rc = p_cuCtxDestroy_v2(other);
            check(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
            printf("ctxdestroy %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "reset") == 0) {
            check(p_cuMemAlloc_v2(&ptr, n), "cuMemAlloc_v2");
            rc = p_cuDevicePrimaryCtxReset_v2(dev);
            check(p_cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
            check(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
            printf("reset %d\n", (int)rc);
            i++;
        } else if (strcmp(step, "churn") == 0) {
            printf("churning\n");
            for (;;) {
                if (p_cuMemAlloc_v2(&ptr, n) == CUDA_SUCCESS) p_cuMemFree_v2(ptr);
            }
        } else if (strcmp(step, "tfill") == 0) {
            tfill(ctx, (int)n, strtoull(argv[i + 2], NULL, 0));
            i += 2;
        } else if (strcmp(step, "exec") == 0) {
            argv[i] = argv[0];
            execv(argv[0], argv + i);
            perror("shim_client: execv");
            return 2;
        } else if (strcmp(step, "hold") == 0) {
            printf("holding\n");
            for (;;) pause();
        } else {
            fprintf(stderr, "shim_client: unknown step %s\n", step);
            return 2;
        }
    }
    return 0;
}
