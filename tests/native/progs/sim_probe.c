/*
 * Exercises the simulated CUDA driver for tests/native/test_simcuda.py; built against
 * native/include/gpupool_cuda.h and linked with the driver as libcuda.so.1. One scenario per
 * command-line verb; every line it prints is `key=value` pairs the test reads.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static CUfunction kernel(void) {
    static const char image[] = "not a real cubin: the simulation runs no device code";
    CUmodule mod;
    CUfunction fn;
    CK(cuModuleLoadData(&mod, image));
    CK(cuModuleGetFunction(&fn, mod, "probe_kernel"));
    return fn;
}

static void use_device(int ordinal) {
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx, ordinal));
    CK(cuCtxSetCurrent(ctx));
}

static void print_meminfo(const char *tag) {
    size_t free_b, total;
    CK(cuMemGetInfo_v2(&free_b, &total));
    printf("meminfo tag=%s free=%zu total=%zu\n", tag, free_b, total);
}

static void wait_for_stdin(void) {
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof line, stdin) == NULL) return;
}

static int cmd_enum(void) {
    int count, v;
    CUresult rc = cuInit(0);
    printf("init rc=%d\n", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;
    CK(cuDeviceGetCount(&count));
    printf("count n=%d\n", count);
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        char name[96], pci[32];
        size_t total;
        CUuuid uuid;
        CK(cuDeviceGet(&dev, i));
        CK(cuDeviceGetName(name, sizeof name, dev));
        CK(cuDeviceTotalMem_v2(&total, dev));
        CK(cuDeviceGetUuid_v2(&uuid, dev));
        CK(cuDeviceGetPCIBusId(pci, sizeof pci, dev));
        printf("dev i=%d total=%zu pci=%s uuid=", i, total, pci);
        for (int b = 0; b < 16; b++) printf("%02x", (unsigned char)uuid.bytes[b]);
        static const struct {
            const char *key;
            CUdevice_attribute attr;
        } attrs[] = {{"sm", CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
                     {"major", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
                     {"minor", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
                     {"warp", CU_DEVICE_ATTRIBUTE_WARP_SIZE},
                     {"maxthreads", CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK}};
        for (size_t a = 0; a < sizeof attrs / sizeof attrs[0]; a++) {
            CK(cuDeviceGetAttribute(&v, attrs[a].attr, dev));
            printf(" %s=%d", attrs[a].key, v);
        }
        printf(" name=%s\n", name); /* last: the name holds spaces */
    }
    return 0;
}

/* alloc SIZE...: allocate, report, hold until a line arrives on stdin, free, report */
static int cmd_alloc(int argc, char **argv) {
    use_device(0);
    CUdeviceptr ptrs[32] = {0};
    int n = argc < 32 ? argc : 32;
    for (int i = 0; i < n; i++) {
        CUresult rc = cuMemAlloc_v2(&ptrs[i], strtoull(argv[i], NULL, 10));
        printf("alloc size=%s rc=%d\n", argv[i], (int)rc);
        if (rc == CUDA_SUCCESS)
            memset((void *)(uintptr_t)ptrs[i], 0xab, 4096); /* it is host-writable memory */
    }
    print_meminfo("held");
    wait_for_stdin();
    for (int i = 0; i < n; i++)
        if (ptrs[i] != 0) CK(cuMemFree_v2(ptrs[i]));
    print_meminfo("freed");
    return 0;
}

/* the virtual-memory path and arrays, with the memory counted at each step */
static int cmd_vmm(void) {
    use_device(0);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t gran;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t size = 16 * gran;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    print_meminfo("start");
    CK(cuMemCreate(&handle, size, &prop, 0));
    print_meminfo("created");
    CK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CK(cuMemMap(va, size, 0, handle, 0));
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(va, size, &access, 1));
    unsigned int local = 0; /* mapping outside a reservation must not clobber this process */
    printf("vmmerr outside=%d twice=%d free_mapped=%d\n",
           (int)cuMemMap((CUdeviceptr)(uintptr_t)&local, gran, 0, handle, 0),
           (int)cuMemMap(va, gran, 0, handle, 0), (int)cuMemAddressFree(va, size));
    CK(cuMemsetD32_v2(va, 0x01020304u, size / 4));
    unsigned int word;
    CK(cuMemcpyDtoH_v2(&word, va + size - 4, 4));
    printf("vmm gran=%zu word=%08x\n", gran, word);
    CK(cuMemRelease(handle));
    print_meminfo("released-still-mapped");
    CK(cuMemUnmap(va, size));
    print_meminfo("unmapped");
    CK(cuMemAddressFree(va, size));
    CUDA_ARRAY_DESCRIPTOR d2 = {
        .Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 64,
                                  .Height = 64,
                                  .Depth = 64,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                  .NumChannels = 1};
    CUarray a2, a3;
    CUmipmappedArray mip;
    CK(cuArrayCreate_v2(&a2, &d2));
    CK(cuArray3DCreate_v2(&a3, &d3));
    CK(cuMipmappedArrayCreate(&mip, &d3, 2));
    print_meminfo("arrays");
    CK(cuArrayDestroy(a2));
    CK(cuArrayDestroy(a3));
    CK(cuMipmappedArrayDestroy(mip));
    print_meminfo("arrays-destroyed");
    CUmemoryPool pool, dflt;
    CUmemPoolProps pool_props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr from_pool, from_default;
    CK(cuMemPoolCreate(&pool, &pool_props));
    CK(cuDeviceGetDefaultMemPool(&dflt, 0));
    CK(cuMemAllocFromPoolAsync(&from_pool, 3u << 20, pool, NULL));
    CK(cuMemAllocFromPoolAsync(&from_default, 5u << 20, dflt, NULL));
    print_meminfo("pools");
    CK(cuMemFreeAsync(from_pool, NULL));
    CK(cuMemFreeAsync(from_default, NULL));
    CK(cuMemPoolDestroy(pool));
    printf("pool destroy_default_rc=%d\n", (int)cuMemPoolDestroy(dflt));
    print_meminfo("pools-freed");
    size_t pitch;
    CUdeviceptr pitched;
    CK(cuMemAllocPitch_v2(&pitched, &pitch, 1000, 10, 4));
    printf("pitch value=%zu\n", pitch);
    print_meminfo("pitched");
    return 0;
}

/* kernels N GRID BLOCK: time N launches with events and the wall clock */
static int cmd_kernels(int argc, char **argv) {
    if (argc < 3) return 2;
    int n = atoi(argv[0]);
    unsigned grid = (unsigned)atoi(argv[1]), block = (unsigned)atoi(argv[2]);
    use_device(0);
    CUfunction fn = kernel();
    CUstream stream;
    CUevent start, stop;
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&start, 0));
    CK(cuEventCreate(&stop, 0));
    double t0 = now_ms();
    CK(cuEventRecord(start, stream));
    for (int i = 0; i < n; i++)
        CK(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, NULL, NULL));
    CK(cuEventRecord(stop, stream));
    double queued = now_ms() - t0;
    CUresult q = cuEventQuery(stop);
    CUresult sq = cuStreamQuery(stream);
    CK(cuStreamSynchronize(stream));
    double wall = now_ms() - t0;
    float ms;
    CK(cuEventElapsedTime(&ms, start, stop));
    printf("kernels queued_ms=%.3f wall_ms=%.3f event_ms=%.3f query_rc=%d stream_query_rc=%d "
           "after_rc=%d\n",
           queued, wall, ms, (int)q, (int)sq, (int)cuStreamQuery(stream));
    return 0;
}

/* a graph built by hand (3 kernels) and one captured from a stream (2 kernels and a fill) */
static int cmd_graph(void) {
    use_device(0);
    CUfunction fn = kernel();
    CUstream stream;
    CUevent a, b;
    float ms;
    CK(cuStreamCreate(&stream, 0));
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));

    CUgraph graph;
    CUgraphNode node, prev = NULL;
    CK(cuGraphCreate(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS params = {.func = fn,
                                      .gridDimX = 256,
                                      .gridDimY = 1,
                                      .gridDimZ = 1,
                                      .blockDimX = 128,
                                      .blockDimY = 1,
                                      .blockDimZ = 1};
    for (int i = 0; i < 3; i++) {
        CK(cuGraphAddKernelNode_v2(&node, graph, prev ? &prev : NULL, prev ? 1 : 0, &params));
        prev = node;
    }
    CUgraphExec exec;
    CK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    CK(cuEventRecord(a, stream));
    CK(cuGraphLaunch(exec, stream));
    CK(cuEventRecord(b, stream));
    CK(cuEventSynchronize(b));
    CK(cuEventElapsedTime(&ms, a, b));
    printf("graph type=manual event_ms=%.3f\n", ms);

    CUdeviceptr buf;
    CK(cuMemAlloc_v2(&buf, 4096));
    CK(cuMemsetD32_v2(buf, 0, 1024));
    CUgraph captured;
    CUstreamCaptureStatus status;
    CK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuStreamIsCapturing(stream, &status));
    CK(cuLaunchKernel(fn, 256, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
    CK(cuMemsetD32Async(buf, 7, 1024, stream));
    CK(cuLaunchKernel(fn, 256, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
    CK(cuStreamEndCapture(stream, &captured));
    unsigned int before;
    CK(cuMemcpyDtoH_v2(&before, buf, 4));
    CUgraphExec exec2;
    CK(cuGraphInstantiateWithFlags(&exec2, captured, 0));
    CK(cuEventRecord(a, stream));
    CK(cuGraphLaunch(exec2, stream));
    CK(cuEventRecord(b, stream));
    CK(cuEventSynchronize(b));
    CK(cuEventElapsedTime(&ms, a, b));
    unsigned int after;
    CK(cuMemcpyDtoH_v2(&after, buf, 4));
    printf("graph type=captured event_ms=%.3f capturing=%d before=%u after=%u\n", ms, (int)status,
           before, after);
    /* CUDA 12 libraries: a CUkernel launches directly or through its CUfunction */
    CUlibrary lib;
    CUkernel kern;
    CUfunction kfn;
    CK(cuLibraryLoadData(&lib, "any image", NULL, NULL, 0, NULL, NULL, 0));
    CK(cuLibraryGetKernel(&kern, lib, "library_kernel"));
    CK(cuKernelGetFunction(&kfn, kern));
    CK(cuEventRecord(a, stream));
    CK(cuLaunchKernel((CUfunction)kern, 256, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
    CK(cuLaunchKernel(kfn, 512, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
    CK(cuEventRecord(b, stream));
    CK(cuEventSynchronize(b));
    CK(cuEventElapsedTime(&ms, a, b));
    CK(cuLibraryUnload(lib));
    printf("graph type=library event_ms=%.3f\n", ms);
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphExecDestroy(exec2));
    CK(cuGraphDestroy(graph));
    CK(cuGraphDestroy(captured));
    return 0;
}

/* cuGetProcAddress answers by base name and version, like the real driver */
static int cmd_procaddr(void) {
    void *fn, *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUdriverProcAddressQueryResult status;
    CK(cuInit(0));
    CK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12040, 0, &status));
    printf("lookup sym=cuMemAlloc v=12040 same=%d status=%d\n", fn == dlsym(self, "cuMemAlloc_v2"),
           (int)status);
    CUresult rc = cuGetProcAddress_v2("cuMemAlloc", &fn, 3000, 0, &status);
    printf("lookup sym=cuMemAlloc v=3000 rc=%d status=%d\n", (int)rc, (int)status);
    rc = cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12040, 0, &status);
    printf("lookup sym=cuNoSuchFunction rc=%d status=%d null=%d\n", (int)rc, (int)status,
           fn == NULL);
    CK(cuGetProcAddress_v2("cuLaunchKernel", &fn, 12040,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
    printf("lookup sym=cuLaunchKernel ptsz=%d\n", fn == dlsym(self, "cuLaunchKernel_ptsz"));
    /* the per-thread flavour exists from CUDA 7.0 on (cudaTypedefs.h:
     * PFN_cuLaunchKernel_v7000_ptsz) */
    CK(cuGetProcAddress_v2("cuLaunchKernel", &fn, 6050,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
    printf("lookup sym=cuLaunchKernel v=6050 legacy=%d\n", fn == dlsym(self, "cuLaunchKernel"));
    CK(cuGetProcAddress_v2("cuLaunchKernel", &fn, 7000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
    printf("lookup sym=cuLaunchKernel v=7000 ptsz=%d\n", fn == dlsym(self, "cuLaunchKernel_ptsz"));
    CK(cuGetProcAddress("cuGetProcAddress", &fn, 12000, 0));
    printf("lookup sym=cuGetProcAddress v2=%d\n", fn == dlsym(self, "cuGetProcAddress_v2"));
    CK(cuGetProcAddress("cuGraphInstantiate", &fn, 12040, 0));
    printf("lookup sym=cuGraphInstantiate withflags=%d\n",
           fn == dlsym(self, "cuGraphInstantiateWithFlags"));
    /* a call through a looked-up pointer reaches the driver */
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CK(cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12040, 0, &status));
    use_device(0);
    CUdeviceptr p;
    printf("call rc=%d\n", (int)alloc(&p, 1 << 20));
    const char *name, *text;
    CK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name));
    CK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &text));
    int version;
    CK(cuDriverGetVersion(&version));
    printf("errors err=%s version=%d\n", name, version);
    printf("errtext name=%s\n", text);
    return 0;
}

/* contexts: created ones push, pop and destroy; destroying gives their memory back */
static int cmd_contexts(void) {
    CUcontext primary, created, current, popped;
    CUdevice dev;
    CK(cuInit(0));
    CUresult before = cuMemAlloc_v2(&(CUdeviceptr){0}, 1);
    CK(cuDevicePrimaryCtxRetain(&primary, 0));
    CK(cuCtxSetCurrent(primary));
    CK(cuCtxCreate_v2(&created, 0, 0));
    CK(cuCtxGetCurrent(&current));
    CK(cuCtxGetDevice(&dev));
    printf("ctx no_ctx_rc=%d created_current=%d dev=%d\n", (int)before, current == created,
           (int)dev);
    CUdeviceptr p;
    void *pinned;
    CK(cuMemAlloc_v2(&p, 1 << 30));
    CK(cuMemAllocHost_v2(&pinned, 4096));
    print_meminfo("created-alloc");
    CK(cuCtxPopCurrent_v2(&popped));
    CK(cuCtxGetCurrent(&current));
    printf("ctx popped_created=%d primary_current=%d\n", popped == created, current == primary);
    CK(cuCtxPushCurrent_v2(created));
    CK(cuCtxSynchronize());
    CK(cuCtxDestroy_v2(created));
    CK(cuCtxGetCurrent(&current));
    printf("ctx after_destroy_primary=%d pinned_gone_rc=%d\n", current == primary,
           (int)cuMemFreeHost(pinned));
    print_meminfo("destroyed");
    return 0;
}

/* stream order across streams: a wait on an event recorded after a kernel elsewhere */
static int cmd_streams(void) {
    use_device(0);
    CUfunction fn = kernel();
    CUstream s1, s2;
    CUevent done, start, end;
    float ms;
    CK(cuStreamCreateWithPriority(&s1, CU_STREAM_NON_BLOCKING, -1));
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&start, 0));
    CK(cuEventCreate(&end, 0));
    CK(cuEventRecord(start, s1));
    CK(cuLaunchKernel(fn, 256 * 20, 1, 1, 128, 1, 1, 0, s1, NULL, NULL)); /* 20 ms */
    CK(cuEventRecord(done, s1));
    CK(cuStreamWaitEvent(s2, done, 0));
    CK(cuEventRecord(end, s2));
    CK(cuEventSynchronize(end));
    CK(cuEventElapsedTime(&ms, start, end));
    CUresult no_timing = cuEventElapsedTime(&ms, start, done);
    printf("streams waited_ms=%.3f no_timing_rc=%d\n", ms, (int)no_timing);
    CK(cuStreamDestroy_v2(s1));
    CK(cuStreamDestroy_v2(s2));
    CK(cuEventDestroy_v2(done));
    return 0;
}

/* hold SIZE: allocate, then wait to be killed */
static int cmd_hold(int argc, char **argv) {
    use_device(0);
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, argc > 0 ? strtoull(argv[0], NULL, 10) : (1u << 30)));
    CK(cuLaunchKernel(kernel(), 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
    CK(cuCtxSynchronize());
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    pause();
    return 0;
}

/* exec SIZE1 SIZE2: allocate SIZE1 and launch, then exec this program as `exec-image SIZE2`,
 * which keeps the pid (and its start time) but none of the old image's allocations */
static int cmd_exec(int argc, char **argv) {
    if (argc < 2) return 2;
    use_device(0);
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, strtoull(argv[0], NULL, 10)));
    CK(cuLaunchKernel(kernel(), 256, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
    CK(cuCtxSynchronize());
    char *next[] = {"sim_probe", "exec-image", argv[1], NULL};
    execv("/proc/self/exe", next);
    perror("execv");
    return 3;
}

static int cmd_exec_image(int argc, char **argv) {
    use_device(0);
    print_meminfo("new-image");
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, argc > 0 ? strtoull(argv[0], NULL, 10) : (1u << 20)));
    print_meminfo("new-image-alloc");
    wait_for_stdin();
    return 0;
}

/* rc: the results of a few calls, for scenarios (lost GPU, no node) */
static int cmd_rc(void) {
    CUresult rc = cuInit(0);
    printf("init rc=%d\n", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;
    CUcontext ctx;
    CUdeviceptr p;
    int count = -1;
    cuDeviceGetCount(&count);
    printf("count n=%d\n", count);
    printf("retain rc=%d\n", (int)cuDevicePrimaryCtxRetain(&ctx, 0));
    cuCtxSetCurrent(ctx);
    printf("alloc rc=%d\n", (int)cuMemAlloc_v2(&p, 1 << 20));
    return 0;
}

/* fork: a child forked after cuInit cannot use CUDA, and leaves the parent's accounting alone */
static int cmd_fork(void) {
    use_device(0);
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, 1 << 30));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        CUdeviceptr q;
        printf("child init_rc=%d alloc_rc=%d free_rc=%d\n", (int)cuInit(0),
               (int)cuMemAlloc_v2(&q, 1 << 20), (int)cuMemFree_v2(p));
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    print_meminfo("parent");
    return 0;
}

/* extras: pinned host memory, pointer queries, priorities, peers, kernel attributes */
static int cmd_extras(void) {
    use_device(0);
    CUfunction fn = kernel();
    CUdeviceptr dev;
    void *pinned;
    static char registered[8192];
    CK(cuMemAlloc_v2(&dev, 1 << 20));
    CK(cuMemAllocHost_v2(&pinned, 4096));
    CK(cuMemHostRegister_v2(registered, sizeof registered, 0));
    print_meminfo("extras"); /* pinned host memory is not GPU memory */
    unsigned int type_dev, type_host, type_reg;
    int ordinal;
    CUdeviceptr start;
    size_t size;
    CUcontext owner, current;
    CK(cuPointerGetAttribute(&type_dev, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev + 4096));
    CK(cuPointerGetAttribute(&type_host, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)pinned));
    CK(cuPointerGetAttribute(&type_reg, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                             (CUdeviceptr)(registered + 100)));
    CK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dev));
    CK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, dev));
    CK(cuCtxGetCurrent(&current));
    CK(cuMemGetAddressRange_v2(&start, &size, dev + 12345));
    int local = 0;
    printf("pointers dev=%u host=%u registered=%u ordinal=%d owner_is_current=%d range_ok=%d "
           "unknown_rc=%d\n",
           type_dev, type_host, type_reg, ordinal, owner == current,
           start == dev && size == 1 << 20,
           (int)cuPointerGetAttribute(&type_dev, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      (CUdeviceptr)(uintptr_t)&local));
    CK(cuMemHostUnregister(registered));
    CK(cuMemFreeHost(pinned));
    printf("freeing free_again_rc=%d unregister_again_rc=%d\n", (int)cuMemFreeHost(pinned),
           (int)cuMemHostUnregister(registered));
    int least, greatest, peer01, peer00, regs, blocks, blocks_smem;
    CK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CK(cuDeviceCanAccessPeer(&peer01, 0, 1));
    CK(cuDeviceCanAccessPeer(&peer00, 0, 0));
    CK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn));
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 256, 0));
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_smem, fn, 128, 100000));
    CUresult coop_ok = cuLaunchCooperativeKernel(fn, 132 * 8, 1, 1, 256, 1, 1, 0, NULL, NULL);
    CUresult coop_big = cuLaunchCooperativeKernel(fn, 132 * 8 + 1, 1, 1, 256, 1, 1, 0, NULL, NULL);
    printf("misc least=%d greatest=%d peer01=%d peer00=%d maxthreads=%d blocks=%d blocks_smem=%d "
           "coop_ok=%d coop_big=%d\n",
           least, greatest, peer01, peer00, regs, blocks, blocks_smem, (int)coop_ok, (int)coop_big);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *verb = argv[1];
    if (strcmp(verb, "enum") == 0) return cmd_enum();
    if (strcmp(verb, "alloc") == 0) return cmd_alloc(argc - 2, argv + 2);
    if (strcmp(verb, "vmm") == 0) return cmd_vmm();
    if (strcmp(verb, "kernels") == 0) return cmd_kernels(argc - 2, argv + 2);
    if (strcmp(verb, "graph") == 0) return cmd_graph();
    if (strcmp(verb, "procaddr") == 0) return cmd_procaddr();
    if (strcmp(verb, "contexts") == 0) return cmd_contexts();
    if (strcmp(verb, "streams") == 0) return cmd_streams();
    if (strcmp(verb, "hold") == 0) return cmd_hold(argc - 2, argv + 2);
    if (strcmp(verb, "rc") == 0) return cmd_rc();
    if (strcmp(verb, "fork") == 0) return cmd_fork();
    if (strcmp(verb, "extras") == 0) return cmd_extras();
    if (strcmp(verb, "exec") == 0) return cmd_exec(argc - 2, argv + 2);
    if (strcmp(verb, "exec-image") == 0) return cmd_exec_image(argc - 2, argv + 2);
    return 2;
}
