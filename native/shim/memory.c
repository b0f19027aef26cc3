/*
 * The allocation family, the frees, and the memory queries. An allocation first reserves its
 * bytes in the share's region (so two processes cannot pass the limit together), then calls the
 * driver, and gives the reservation back if the driver says no. Queries report the share: total =
 * the limit, free = the limit less what the whole share holds.
 */
#include <string.h>

#include "shim.h"

static uint64_t device_total[GP_MAX_DEVICES]; /* the GPU's own memory, learnt once */
static int clamp_warned[GP_MAX_DEVICES];

static uint64_t real_total(int dev) {
    uint64_t total = __atomic_load_n(&device_total[dev], __ATOMIC_RELAXED);
    if (total != 0) return total;
    __typeof__(&cuDeviceTotalMem_v2) real = GP_REAL(cuDeviceTotalMem_v2);
    size_t bytes = 0;
    if (real == NULL || real(&bytes, dev) != CUDA_SUCCESS) return 0;
    __atomic_store_n(&device_total[dev], (uint64_t)bytes, __ATOMIC_RELAXED);
    return bytes;
}

uint64_t gp_memory_limit(int dev) {
    if (dev < 0 || dev >= GP_MAX_DEVICES) return 0;
    uint64_t limit = gp_region_memory_limit(dev);
    if (limit == 0) return 0;
    uint64_t total = real_total(dev);
    if (total != 0 && limit > total) {
        if (!__atomic_exchange_n(&clamp_warned[dev], 1, __ATOMIC_RELAXED)) {
            char want[32], have[32];
            gp_format_bytes(limit, want, sizeof want);
            gp_format_bytes(total, have, sizeof have);
            gp_log(GP_LOG_WARN,
                   "memory limit %s on device %d is more than the GPU has (%s); "
                   "using %s",
                   want, dev, have, have);
        }
        return total;
    }
    return limit;
}

/* The calling thread's context and its device, with the device cached per thread: one driver
 * call per allocation or launch instead of two. A context handle may be reused for another device
 * after a context is destroyed, so teardown bumps a generation that invalidates every thread's
 * cache. */
static uint64_t context_generation;
/* initial-exec: the library is preloaded, and a lookup through __tls_get_addr at every launch
 * is a measurable cost */
#define GP_TLS __thread __attribute__((tls_model("initial-exec")))
static GP_TLS CUcontext cached_ctx;
static GP_TLS int cached_dev = -1;
static GP_TLS uint64_t cached_generation;

int gp_current_device_and_context(uint64_t *ctx_out) {
    __typeof__(&cuCtxGetCurrent) get_current = GP_REAL(cuCtxGetCurrent);
    __typeof__(&cuCtxGetDevice) get_device = GP_REAL(cuCtxGetDevice);
    CUcontext ctx = NULL;
    *ctx_out = 0;
    if (get_current == NULL || get_device == NULL) return -1;
    if (get_current(&ctx) != CUDA_SUCCESS || ctx == NULL) return -1;
    *ctx_out = (uint64_t)(uintptr_t)ctx;
    uint64_t generation = __atomic_load_n(&context_generation, __ATOMIC_ACQUIRE);
    if (ctx == cached_ctx && generation == cached_generation) return cached_dev;
    CUdevice dev = -1;
    if (get_device(&dev) != CUDA_SUCCESS) return -1;
    cached_ctx = ctx;
    cached_generation = generation;
    cached_dev = dev >= 0 && dev < GP_MAX_DEVICES ? dev : -1;
    return cached_dev;
}

static int current_device(void) {
    uint64_t ctx;
    return gp_current_device_and_context(&ctx);
}

static void forget_context(uint64_t ctx) {
    __atomic_add_fetch(&context_generation, 1, __ATOMIC_RELEASE);
    gp_ptrmap_drop_context(ctx, gp_region_release);
}

/* a program that retries a refused allocation in a loop would otherwise write a line per try
 * (thousands a second): the first few are logged, the rest counted and reported at exit */
#define GP_REFUSALS_LOGGED 5
static uint64_t refusals;

/* 0: reserved (or nothing to account); -1: over the limit, the caller returns out of memory */
static int reserve(int dev, uint64_t bytes) {
    if (dev < 0) return 0;
    if (gp_elastic_enabled()) {
        gp_elastic_gate();
        gp_elastic_start();
    }
    uint64_t limit = gp_memory_limit(dev), used = 0;
    if (gp_region_reserve(dev, bytes, limit, &used) == 0) return 0;
    char used_text[32], asked_text[32], limit_text[32];
    gp_format_bytes(used, used_text, sizeof used_text);
    gp_format_bytes(bytes, asked_text, sizeof asked_text);
    gp_format_bytes(limit, limit_text, sizeof limit_text);
    uint64_t count = __atomic_add_fetch(&refusals, 1, __ATOMIC_RELAXED);
    gp_region_count_refusal(dev);
    if (count <= GP_REFUSALS_LOGGED)
        gp_log(GP_LOG_WARN, "out of memory on device %d: %s used + %s asked > limit %s%s", dev,
               used_text, asked_text, limit_text,
               count == GP_REFUSALS_LOGGED ? " (further refusals are counted, not logged)" : "");
    return -1;
}

void gp_memory_report_refusals(void) {
    uint64_t count = __atomic_load_n(&refusals, __ATOMIC_RELAXED);
    if (count > GP_REFUSALS_LOGGED)
        gp_log(GP_LOG_WARN, "%llu allocations refused in all, over the memory limit",
               (unsigned long long)count);
}

/* after the driver call: remember the allocation (with the context it dies with; VMM handles
 * outlive contexts), or give the reservation back */
static void settle(CUresult rc, uint64_t key, gp_alloc_kind kind, int dev, uint64_t bytes,
                   uint64_t ctx) {
    if (dev < 0) return;
    if (rc == CUDA_SUCCESS) {
        gp_ptrmap_put(key, kind, dev, bytes, kind == GP_KIND_MEMHANDLE ? 0 : ctx);
    } else {
        gp_region_release(dev, bytes);
    }
}

/* a free: forget the allocation first (its address may be reused by another thread as soon as
 * the driver frees it), credit once the driver has freed, put it back if the driver refused */
static CUresult credit_free(uint64_t key, gp_alloc_kind kind, CUresult (*do_free)(void *),
                            void *arg) {
    int dev = -1;
    uint64_t bytes = 0, ctx = 0;
    int known = gp_ptrmap_take(key, kind, &dev, &bytes, &ctx) == 0;
    if (!known && kind == GP_KIND_DEVPTR &&
        gp_ptrmap_take(key, GP_KIND_BURST, &dev, &bytes, &ctx) == 0) {
        CUresult rc = do_free(arg);
        if (rc == CUDA_SUCCESS)
            gp_elastic_burst_freed(key, bytes, dev);
        else
            gp_ptrmap_put(key, GP_KIND_BURST, dev, bytes, ctx);
        return rc;
    }
    CUresult rc = do_free(arg);
    if (!known) return rc;
    if (rc == CUDA_SUCCESS) {
        gp_region_release(dev, bytes);
    } else {
        gp_ptrmap_put(key, kind, dev, bytes, ctx);
    }
    return rc;
}

/* ---- allocations ---------------------------------------------------------------------------- */

/* an elastic allocation: managed memory within the share; past it, within the share's burst */
static CUresult alloc_managed(__typeof__(&cuMemAllocManaged) managed, CUdeviceptr *dptr,
                              size_t bytesize, int dev, uint64_t ctx) {
    gpupool_region_elastic *e = gp_region_elastic();
    uint64_t limit = gp_memory_limit(dev), used = 0;
    int burst = e != NULL && e->burst_limit[dev] != 0 && limit != 0;
    if (!burst) {
        if (reserve(dev, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        gp_elastic_gate();
        gp_elastic_start();
        if (gp_region_reserve(dev, bytesize, limit, &used) == 0) {
            burst = 0; /* within the share */
        } else if (gp_region_burst_reserve(dev, bytesize) != 0) {
            /* past the burst too: refused as any allocation over the limit (logged, counted) */
            if (reserve(dev, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
            burst = 0;
        }
    }
    gp_alloc_kind kind = burst ? GP_KIND_BURST : GP_KIND_DEVPTR;
    CUresult rc = managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL);
    if (kind == GP_KIND_BURST) {
        if (rc == CUDA_SUCCESS) {
            gp_ptrmap_put(*dptr, kind, dev, bytesize, ctx);
            gp_elastic_placed_burst(*dptr, bytesize, dev, ctx);
        } else {
            gp_region_burst_release(dev, bytesize);
        }
        return rc;
    }
    settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_KIND_DEVPTR, dev, bytesize, ctx);
    return rc;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    __typeof__(&cuMemAlloc_v2) real = GP_REAL(cuMemAlloc_v2);
    __typeof__(&cuMemAllocManaged) managed = GP_REAL(cuMemAllocManaged);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    /* elastic: managed memory, which suspend can move to the host at the same address */
    if (gp_elastic_enabled() && managed != NULL && dev >= 0)
        return alloc_managed(managed, dptr, bytesize, dev, ctx);
    if (reserve(dev, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, bytesize);
    settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_KIND_DEVPTR, dev, bytesize, ctx);
    return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    __typeof__(&cuMemAllocManaged) real = GP_REAL(cuMemAllocManaged);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    if (reserve(dev, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, bytesize, flags);
    settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_KIND_DEVPTR, dev, bytesize, ctx);
    return rc;
}

/* pitched rows are padded to the driver's pitch: reserve the widest padding, keep the real size */
#define GP_MAX_PITCH_ALIGN 512u

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
    __typeof__(&cuMemAllocPitch_v2) real = GP_REAL(cuMemAllocPitch_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    size_t padded =
        (WidthInBytes + GP_MAX_PITCH_ALIGN - 1) / GP_MAX_PITCH_ALIGN * GP_MAX_PITCH_ALIGN;
    uint64_t bound = (uint64_t)padded * Height;
    if (reserve(dev, bound) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc != CUDA_SUCCESS || dev < 0) {
        settle(rc, 0, GP_KIND_DEVPTR, dev, bound, ctx);
        return rc;
    }
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual < bound) {
        gp_region_release(dev, bound - actual);
    } else if (actual > bound) {
        uint64_t used = 0;
        gp_region_reserve(dev, actual - bound, 0, &used);
    }
    gp_ptrmap_put(*dptr, GP_KIND_DEVPTR, dev, actual, ctx);
    return rc;
}

static CUresult alloc_async(CUresult (*real)(CUdeviceptr *, size_t, CUstream), CUdeviceptr *dptr,
                            size_t bytesize, CUstream stream) {
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    if (reserve(dev, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, bytesize, stream);
    settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_KIND_DEVPTR, dev, bytesize, ctx);
    return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(GP_REAL(cuMemAllocAsync), dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(GP_REAL(cuMemAllocAsync_ptsz), dptr, bytesize, hStream);
}

static CUresult alloc_from_pool(CUresult (*real)(CUdeviceptr *, size_t, CUmemoryPool, CUstream),
                                CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream stream) {
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    if (reserve(dev, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, bytesize, pool, stream);
    settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_KIND_DEVPTR, dev, bytesize, ctx);
    return rc;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
    return alloc_from_pool(GP_REAL(cuMemAllocFromPoolAsync), dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
    return alloc_from_pool(GP_REAL(cuMemAllocFromPoolAsync_ptsz), dptr, bytesize, pool, hStream);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    __typeof__(&cuMemCreate) real = GP_REAL(cuMemCreate);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    /* only physical memory on a GPU counts; host-located handles do not */
    int dev = -1;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        prop->location.id >= 0 && prop->location.id < GP_MAX_DEVICES)
        dev = prop->location.id;
    if (reserve(dev, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(handle, size, prop, flags);
    uint64_t ctx = 0; /* a VMM handle belongs to no context */
    settle(rc, rc == CUDA_SUCCESS ? *handle : 0, GP_KIND_MEMHANDLE, dev, size, ctx);
    return rc;
}

static uint64_t format_bytes(CUarray_format format) {
    switch ((int)format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats, and the widest guess for newer ones */
    }
}

static uint64_t at_least_one(size_t n) { return n ? (uint64_t)n : 1; }

static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t elem = format_bytes(d->Format) * at_least_one(d->NumChannels);
    uint64_t w = at_least_one(d->Width), h = at_least_one(d->Height), z = at_least_one(d->Depth);
    uint64_t total = 0;
    for (unsigned level = 0; level < (levels ? levels : 1); level++) {
        total += w * h * z * elem;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    return total;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    __typeof__(&cuArrayCreate_v2) real = GP_REAL(cuArrayCreate_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (pAllocateArray == NULL) return real(pHandle, pAllocateArray);
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = pAllocateArray->Width,
                                  .Height = pAllocateArray->Height,
                                  .Format = pAllocateArray->Format,
                                  .NumChannels = pAllocateArray->NumChannels};
    uint64_t bytes = array3d_bytes(&d3, 1);
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    if (reserve(dev, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(pHandle, pAllocateArray);
    settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, GP_KIND_ARRAY, dev, bytes,
           ctx);
    return rc;
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    __typeof__(&cuArray3DCreate_v2) real = GP_REAL(cuArray3DCreate_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (pAllocateArray == NULL) return real(pHandle, pAllocateArray);
    uint64_t bytes = array3d_bytes(pAllocateArray, 1);
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    if (reserve(dev, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(pHandle, pAllocateArray);
    settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, GP_KIND_ARRAY, dev, bytes,
           ctx);
    return rc;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels) {
    __typeof__(&cuMipmappedArrayCreate) real = GP_REAL(cuMipmappedArrayCreate);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (pMipmappedArrayDesc == NULL) return real(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    uint64_t bytes = array3d_bytes(pMipmappedArrayDesc, numMipmapLevels);
    uint64_t ctx = 0;
    int dev = gp_current_device_and_context(&ctx);
    if (reserve(dev, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, GP_KIND_MIPMAP, dev, bytes,
           ctx);
    return rc;
}

/* ---- frees ---------------------------------------------------------------------------------- */

typedef struct {
    void *real;
    uint64_t key;
    CUstream stream;
} gp_free_call;

static CUresult call_mem_free(void *arg) {
    gp_free_call *call = arg;
    return ((__typeof__(&cuMemFree_v2))call->real)(call->key);
}

static CUresult call_mem_free_async(void *arg) {
    gp_free_call *call = arg;
    return ((__typeof__(&cuMemFreeAsync))call->real)(call->key, call->stream);
}

static CUresult call_mem_release(void *arg) {
    gp_free_call *call = arg;
    return ((__typeof__(&cuMemRelease))call->real)(call->key);
}

static CUresult call_array_destroy(void *arg) {
    gp_free_call *call = arg;
    return ((__typeof__(&cuArrayDestroy))call->real)((CUarray)(uintptr_t)call->key);
}

static CUresult call_mipmap_destroy(void *arg) {
    gp_free_call *call = arg;
    return ((__typeof__(&cuMipmappedArrayDestroy))call->real)(
        (CUmipmappedArray)(uintptr_t)call->key);
}

static CUresult free_with(void *real, uint64_t key, CUstream stream, gp_alloc_kind kind,
                          CUresult (*call)(void *)) {
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    gp_free_call args = {.real = real, .key = key, .stream = stream};
    return credit_free(key, kind, call, &args);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    return free_with((void *)GP_REAL(cuMemFree_v2), dptr, NULL, GP_KIND_DEVPTR, call_mem_free);
}

/* an asynchronous free is credited when it is asked for, not when the stream gets to it */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    return free_with((void *)GP_REAL(cuMemFreeAsync), dptr, hStream, GP_KIND_DEVPTR,
                     call_mem_free_async);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    return free_with((void *)GP_REAL(cuMemFreeAsync_ptsz), dptr, hStream, GP_KIND_DEVPTR,
                     call_mem_free_async);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    return free_with((void *)GP_REAL(cuMemRelease), handle, NULL, GP_KIND_MEMHANDLE,
                     call_mem_release);
}

CUresult cuArrayDestroy(CUarray hArray) {
    return free_with((void *)GP_REAL(cuArrayDestroy), (uint64_t)(uintptr_t)hArray, NULL,
                     GP_KIND_ARRAY, call_array_destroy);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return free_with((void *)GP_REAL(cuMipmappedArrayDestroy), (uint64_t)(uintptr_t)hMipmappedArray,
                     NULL, GP_KIND_MIPMAP, call_mipmap_destroy);
}

/* ---- queries -------------------------------------------------------------------------------- */

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    __typeof__(&cuMemGetInfo_v2) real = GP_REAL(cuMemGetInfo_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(free, total);
    int dev = rc == CUDA_SUCCESS ? current_device() : -1;
    uint64_t limit = gp_memory_limit(dev);
    if (limit == 0 || free == NULL || total == NULL) return rc;
    uint64_t used = gp_region_used(dev);
    uint64_t share_free = used < limit ? limit - used : 0;
    /* never more than the GPU really has free (other tenants use it too) */
    if (share_free < *free) *free = share_free;
    *total = limit;
    return rc;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    __typeof__(&cuDeviceTotalMem_v2) real = GP_REAL(cuDeviceTotalMem_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(bytes, dev);
    if (rc != CUDA_SUCCESS || bytes == NULL || dev < 0 || dev >= GP_MAX_DEVICES) return rc;
    if (device_total[dev] == 0) __atomic_store_n(&device_total[dev], *bytes, __ATOMIC_RELAXED);
    uint64_t limit = gp_memory_limit(dev);
    if (limit != 0 && limit < *bytes) *bytes = limit;
    return rc;
}

/* ---- context teardown: the driver frees a context's allocations with it ---------------------- */

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    __typeof__(&cuCtxDestroy_v2) real = GP_REAL(cuCtxDestroy_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS) forget_context((uint64_t)(uintptr_t)ctx);
    return rc;
}

/* the primary context of `dev` if it is active (retain + release leaves its count as it was) */
static uint64_t active_primary(CUdevice dev) {
    __typeof__(&cuDevicePrimaryCtxGetState) state = GP_REAL(cuDevicePrimaryCtxGetState);
    __typeof__(&cuDevicePrimaryCtxRetain) retain = GP_REAL(cuDevicePrimaryCtxRetain);
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release = GP_REAL(cuDevicePrimaryCtxRelease_v2);
    unsigned int flags = 0;
    int active = 0;
    CUcontext ctx = NULL;
    if (state == NULL || retain == NULL || release == NULL) return 0;
    if (state(dev, &flags, &active) != CUDA_SUCCESS || !active) return 0;
    if (retain(&ctx, dev) != CUDA_SUCCESS) return 0;
    release(dev);
    return (uint64_t)(uintptr_t)ctx;
}

static int primary_active(CUdevice dev) {
    __typeof__(&cuDevicePrimaryCtxGetState) state = GP_REAL(cuDevicePrimaryCtxGetState);
    unsigned int flags = 0;
    int active = 1;
    if (state == NULL || state(dev, &flags, &active) != CUDA_SUCCESS) return 1;
    return active;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    __typeof__(&cuDevicePrimaryCtxReset_v2) real = GP_REAL(cuDevicePrimaryCtxReset_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = active_primary(dev);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && ctx != 0) forget_context(ctx);
    return rc;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    __typeof__(&cuDevicePrimaryCtxRelease_v2) real = GP_REAL(cuDevicePrimaryCtxRelease_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = active_primary(dev);
    CUresult rc = real(dev);
    /* the last release destroys the primary context, and its allocations with it */
    if (rc == CUDA_SUCCESS && ctx != 0 && !primary_active(dev)) forget_context(ctx);
    return rc;
}
