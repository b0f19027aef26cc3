/*
 * Simulated device memory: host mappings counted against the simulated GPU's memory in state.bin.
 * Linear allocations are MAP_NORESERVE anonymous mappings (an 80 GiB allocation commits no RAM
 * until touched); arrays are counted without storage, since the simulation runs no kernels; the
 * virtual-memory API lives in vmm.c. Copies and fills are plain host memory operations.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"

#define SIM_HASH_BUCKETS 8192u
static sim_mem *sim_linear[SIM_HASH_BUCKETS];

static unsigned sim_hash(uintptr_t ptr) { return (unsigned)((ptr >> 12) % SIM_HASH_BUCKETS); }

void sim_unlink_mem_locked(sim_mem *m) {
    if (m->kind == SIM_MEM_LINEAR) {
        for (sim_mem **pp = &sim_linear[sim_hash(m->ptr)]; *pp != NULL; pp = &(*pp)->hnext) {
            if (*pp == m) {
                *pp = m->hnext;
                break;
            }
        }
    }
    if (m->ctx != NULL) {
        if (m->prev != NULL)
            m->prev->next = m->next;
        else
            m->ctx->mems = m->next;
        if (m->next != NULL) m->next->prev = m->prev;
    }
}

/* Freed mappings kept for reuse by an allocation of the same size: a real cuMemAlloc makes no
 * system call, and without this cache mmap/munmap would dominate the cost of an allocation. */
#define SIM_CACHE_SLOTS 32
#define SIM_CACHE_MAX_BYTES (64ull << 20)    /* the largest mapping kept */
#define SIM_CACHE_TOTAL_BYTES (256ull << 20) /* bounds the host memory the cache may hold */
static struct {
    uintptr_t ptr;
    size_t size;
} sim_cache[SIM_CACHE_SLOTS];
static int sim_cache_count;
static size_t sim_cache_bytes;

static void *sim_map_linear(size_t size) {
    pthread_mutex_lock(&g_sim.mu);
    for (int i = 0; i < sim_cache_count; i++) {
        if (sim_cache[i].size == size) {
            void *p = (void *)sim_cache[i].ptr;
            sim_cache_bytes -= size;
            sim_cache[i] = sim_cache[--sim_cache_count];
            pthread_mutex_unlock(&g_sim.mu);
            return p;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                0);
}

static void sim_unmap_linear(uintptr_t ptr, size_t size) {
    if (size <= SIM_CACHE_MAX_BYTES) {
        pthread_mutex_lock(&g_sim.mu);
        int kept =
            sim_cache_count < SIM_CACHE_SLOTS && sim_cache_bytes + size <= SIM_CACHE_TOTAL_BYTES;
        if (kept) {
            sim_cache[sim_cache_count++] = (typeof(sim_cache[0])){ptr, size};
            sim_cache_bytes += size;
        }
        pthread_mutex_unlock(&g_sim.mu);
        if (kept) return;
    }
    munmap((void *)ptr, size);
}

/* Gives the memory back to the GPU and frees the host side; the record is already unlinked. */
void sim_mem_teardown(sim_mem *m) {
    if (!m->on_host) sim_memory_release(m->gpu, m->size);
    if (m->kind == SIM_MEM_LINEAR) sim_unmap_linear(m->ptr, m->size);
    if (m->kind == SIM_MEM_VMM && m->fd >= 0) close(m->fd);
    m->magic = 0;
    free(m);
}

/* Counts `size` against GPU `phys` (-1: the current context's) and makes the record. */
static CUresult sim_mem_new(sim_mem_kind kind, size_t size, int phys, sim_ctx **ctx_out,
                            sim_mem **out, int managed) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (phys < 0)
        phys = ctx->gpu;
    else if (sim_gpu_lost(phys))
        return SIM_LOST_ERROR;
    sim_mem *m = calloc(1, sizeof *m);
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_memory_reserve(phys, size, sim_mps_pinned(phys));
    /* managed memory the GPU has no room for lives in host memory (oversubscription) */
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && managed) {
        m->on_host = 1;
        rc = CUDA_SUCCESS;
    }
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->magic = SIM_MAGIC_MEM;
    m->kind = kind;
    m->managed = managed;
    m->size = size;
    m->gpu = phys;
    m->fd = -1;
    *ctx_out = ctx;
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult sim_alloc_linear_on(CUdeviceptr *dptr, size_t size, int phys, int managed) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *ctx;
    sim_mem *m;
    CUresult rc = sim_mem_new(SIM_MEM_LINEAR, size, phys, &ctx, &m, managed);
    if (rc != CUDA_SUCCESS) return rc;
    void *p = sim_map_linear(size);
    if (p == MAP_FAILED) {
        if (!m->on_host) sim_memory_release(m->gpu, size);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->ptr = (uintptr_t)p;
    pthread_mutex_lock(&g_sim.mu);
    unsigned b = sim_hash(m->ptr);
    m->hnext = sim_linear[b];
    sim_linear[b] = m;
    pthread_mutex_unlock(&g_sim.mu);
    sim_ctx_link_mem(ctx, m);
    *dptr = (CUdeviceptr)m->ptr;
    return CUDA_SUCCESS;
}

static CUresult sim_alloc_linear(CUdeviceptr *dptr, size_t size) {
    return sim_alloc_linear_on(dptr, size, -1, 0);
}

/* The linear allocation holding address `p` (a copy of its record), for pointer queries. */
int sim_linear_find(uintptr_t p, sim_mem *out) {
    const sim_mem *hit = NULL;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_mem *m = sim_linear[sim_hash(p)]; m != NULL && hit == NULL; m = m->hnext)
        if (m->ptr == p) hit = m;
    /* an interior pointer: look through every allocation (pointer queries are rare) */
    for (unsigned b = 0; b < SIM_HASH_BUCKETS && hit == NULL; b++)
        for (sim_mem *m = sim_linear[b]; m != NULL && hit == NULL; m = m->hnext)
            if (p >= m->ptr && p - m->ptr < m->size) hit = m;
    if (hit != NULL) *out = *hit;
    pthread_mutex_unlock(&g_sim.mu);
    return hit != NULL;
}

/* where a managed allocation now lives (migrate.c) */
void sim_linear_set_place(uintptr_t ptr, int gpu, int on_host) {
    pthread_mutex_lock(&g_sim.mu);
    for (sim_mem *m = sim_linear[sim_hash(ptr)]; m != NULL; m = m->hnext) {
        if (m->ptr != ptr) continue;
        m->gpu = gpu;
        m->on_host = on_host;
    }
    pthread_mutex_unlock(&g_sim.mu);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    return sim_alloc_linear(dptr, bytesize);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
    if (pPitch == NULL || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511; /* the texture pitch alignment */
    CUresult rc = sim_alloc_linear(dptr, pitch * Height);
    if (rc == CUDA_SUCCESS) *pPitch = pitch;
    return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc_linear_on(dptr, bytesize, -1, 1);
}

/* Stream-ordered allocation: the memory is ready at once, which is a legal schedule. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    return rc != CUDA_SUCCESS ? rc : sim_alloc_linear(dptr, bytesize);
}

/* A memory pool names the GPU its allocations come from; the simulation keeps no cache in it. */
typedef struct sim_pool {
    uint32_t magic;
    int gpu;
    int is_default;
} sim_pool;

static sim_pool sim_default_pools[GPUPOOL_SIM_MAX_DEVICES];

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (pool_out == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_sim.count) return CUDA_ERROR_INVALID_DEVICE;
    sim_pool *pool = &sim_default_pools[dev];
    pool->gpu = g_sim.phys[dev];
    pool->is_default = 1;
    pool->magic = SIM_MAGIC_POOL;
    *pool_out = (CUmemoryPool)pool;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool_out, const CUmemPoolProps *props) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (pool_out == NULL || props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= g_sim.count)
        return CUDA_ERROR_INVALID_DEVICE;
    sim_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pool->magic = SIM_MAGIC_POOL;
    pool->gpu = g_sim.phys[props->location.id];
    *pool_out = (CUmemoryPool)pool;
    return CUDA_SUCCESS;
}

static sim_pool *sim_pool_of(CUmemoryPool h) {
    sim_pool *pool = (sim_pool *)h;
    return pool != NULL && pool->magic == SIM_MAGIC_POOL ? pool : NULL;
}

CUresult cuMemPoolDestroy(CUmemoryPool h) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_pool *pool = sim_pool_of(h);
    if (pool == NULL || pool->is_default) return CUDA_ERROR_INVALID_VALUE;
    pool->magic = 0;
    free(pool);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool h,
                                 CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    sim_pool *pool = sim_pool_of(h);
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc_linear_on(dptr, bytesize, pool->gpu, 0);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS || dptr == 0) return rc;
    pthread_mutex_lock(&g_sim.mu);
    sim_mem *m = sim_linear[sim_hash((uintptr_t)dptr)];
    while (m != NULL && m->ptr != (uintptr_t)dptr) m = m->hnext;
    if (m != NULL) sim_unlink_mem_locked(m);
    pthread_mutex_unlock(&g_sim.mu);
    if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
    int lost = sim_gpu_lost(m->gpu);
    sim_mem_teardown(m);
    return lost ? SIM_LOST_ERROR : CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    return rc != CUDA_SUCCESS ? rc : cuMemFree_v2(dptr);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
    sim_driver_lock();
    sim_reclaim_dead_locked();
    gpupool_sim_gpu *rec = sim_gpu(ctx->gpu);
    *total = rec->memory_total;
    *free_bytes = rec->memory_used < rec->memory_total ? rec->memory_total - rec->memory_used : 0;
    sim_driver_unlock();
    return CUDA_SUCCESS;
}

/* ---- arrays: counted, no storage ---------------------------------------------------------- */

static size_t sim_format_bytes(CUarray_format format) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static size_t sim_array_bytes(size_t w, size_t h, size_t d, CUarray_format format, unsigned ch) {
    size_t elem = sim_format_bytes(format);
    if (w == 0 || elem == 0 || (ch != 1 && ch != 2 && ch != 4)) return 0;
    return w * (h ? h : 1) * (d ? d : 1) * elem * ch;
}

static CUresult sim_array_new(size_t bytes, void **handle) {
    if (handle == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    sim_ctx *ctx;
    sim_mem *m;
    CUresult rc = sim_mem_new(SIM_MEM_ARRAY, bytes, -1, &ctx, &m, 0);
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx_link_mem(ctx, m);
    *handle = m;
    return CUDA_SUCCESS;
}

static CUresult sim_array_destroy(void *handle) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_mem *m = handle;
    if (m == NULL || m->magic != SIM_MAGIC_MEM || m->kind != SIM_MEM_ARRAY)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.mu);
    sim_unlink_mem_locked(m);
    pthread_mutex_unlock(&g_sim.mu);
    sim_mem_teardown(m);
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = sim_array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels);
    return sim_array_new(bytes, (void **)pHandle);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = sim_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    return sim_array_new(bytes, (void **)pHandle);
}

CUresult cuArrayDestroy(CUarray hArray) { return sim_array_destroy(hArray); }

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels) {
    if (d == NULL || numMipmapLevels == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0, w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned level = 0; level < numMipmapLevels; level++) {
        size_t b = sim_array_bytes(w, h, z, d->Format, d->NumChannels);
        if (b == 0) return CUDA_ERROR_INVALID_VALUE;
        bytes += b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    return sim_array_new(bytes, (void **)pHandle);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return sim_array_destroy(hMipmappedArray);
}

/* ---- copies and fills: done at once; synchronous forms first wait for blocking streams ------- */

enum { SIM_OP_COPY = 1, SIM_OP_SET8 = 2, SIM_OP_SET32 = 3 };

static CUresult sim_memop(int kind, void *dst, const void *src, uint32_t value, size_t count) {
    if (count == 0) return CUDA_SUCCESS;
    if (dst == NULL || (kind == SIM_OP_COPY && src == NULL)) return CUDA_ERROR_INVALID_VALUE;
    if (kind == SIM_OP_COPY) {
        memmove(dst, src, count);
    } else if (kind == SIM_OP_SET8) {
        memset(dst, (int)(value & 0xffu), count);
    } else {
        uint32_t *p = dst;
        for (size_t i = 0; i < count; i++) p[i] = value;
    }
    return CUDA_SUCCESS;
}

/* `link`: the copy crosses the host link (host to device or back), which takes its time */
static CUresult sim_memop_sync(int kind, void *dst, const void *src, uint32_t value, size_t count,
                               int link) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    sim_ctx_wait_blocking(ctx);
    rc = sim_memop(kind, dst, src, value, count);
    if (rc == CUDA_SUCCESS && link) sim_link_copy(ctx, NULL, count);
    return rc;
}

static CUresult sim_memop_async(int kind, void *dst, const void *src, uint32_t value, size_t count,
                                CUstream hStream, int link) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (st->capture != NULL)
        return sim_capture_memop(st, kind, (CUdeviceptr)(uintptr_t)dst, src, value, count);
    rc = sim_memop(kind, dst, src, value, count);
    if (rc == CUDA_SUCCESS && link) sim_link_copy(st->ctx, st, count);
    return rc;
}

#define DEV(p) ((void *)(uintptr_t)(p))

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return sim_memop_sync(SIM_OP_COPY, DEV(dst), DEV(src), 0, n, 0);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    return sim_memop_sync(SIM_OP_COPY, DEV(dst), src, 0, n, 1);
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    return sim_memop_sync(SIM_OP_COPY, dst, DEV(src), 0, n, 1);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return sim_memop_sync(SIM_OP_COPY, DEV(dst), DEV(src), 0, n, 0);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return sim_memop_async(SIM_OP_COPY, DEV(dst), DEV(src), 0, n, s, 0);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return sim_memop_async(SIM_OP_COPY, DEV(dst), src, 0, n, s, 1);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return sim_memop_async(SIM_OP_COPY, dst, DEV(src), 0, n, s, 1);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return sim_memop_async(SIM_OP_COPY, DEV(dst), DEV(src), 0, n, s, 0);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n) {
    return sim_memop_sync(SIM_OP_SET8, DEV(dst), NULL, uc, n, 0);
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int ui, size_t n) {
    return sim_memop_sync(SIM_OP_SET32, DEV(dst), NULL, ui, n, 0);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream s) {
    return sim_memop_async(SIM_OP_SET8, DEV(dst), NULL, uc, n, s, 0);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream s) {
    return sim_memop_async(SIM_OP_SET32, DEV(dst), NULL, ui, n, s, 0);
}

/* replays a copy or fill recorded in a graph */
CUresult sim_memop_replay(int kind, CUdeviceptr dst, const void *src, uint32_t value,
                          size_t count) {
    return sim_memop(kind, DEV(dst), src, value, count);
}
