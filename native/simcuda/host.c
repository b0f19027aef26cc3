/*
 * Page-locked host memory and pointer queries. Pinned host memory is ordinary host memory here
 * (it is not counted against any GPU, as on a real system); the driver remembers it so that
 * cuPointerGetAttribute can tell host from device memory, as unified addressing lets it.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sim.h"

typedef struct sim_host {
    uintptr_t ptr;
    size_t size;
    int registered; /* cuMemHostRegister: the caller's memory, not ours to free */
    sim_ctx *ctx;
    struct sim_host *next;
} sim_host;

static sim_host *sim_hosts;

static CUresult sim_host_track(void *p, size_t size, int registered, sim_ctx *ctx) {
    sim_host *h = calloc(1, sizeof *h);
    if (h == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    h->ptr = (uintptr_t)p;
    h->size = size;
    h->registered = registered;
    h->ctx = ctx;
    pthread_mutex_lock(&g_sim.mu);
    h->next = sim_hosts;
    sim_hosts = h;
    pthread_mutex_unlock(&g_sim.mu);
    return CUDA_SUCCESS;
}

/* unlinks and returns the record starting at `p` (registered or not, as asked) */
static sim_host *sim_host_take(uintptr_t p, int registered) {
    pthread_mutex_lock(&g_sim.mu);
    sim_host *found = NULL;
    for (sim_host **pp = &sim_hosts; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->ptr == p && (*pp)->registered == registered) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    return found;
}

/* A context that is destroyed or reset takes its pinned memory and registrations with it. */
void sim_host_release_ctx(sim_ctx *ctx) {
    sim_host *gone = NULL;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_host **pp = &sim_hosts; *pp != NULL;) {
        sim_host *h = *pp;
        if (h->ctx == ctx) {
            *pp = h->next;
            h->next = gone;
            gone = h;
        } else {
            pp = &h->next;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    while (gone != NULL) {
        sim_host *next = gone->next;
        if (!gone->registered) munmap((void *)gone->ptr, gone->size);
        free(gone);
        gone = next;
    }
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (pp == NULL || bytesize == 0 ||
        (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_host_track(p, bytesize, 0, ctx);
    if (rc != CUDA_SUCCESS) {
        munmap(p, bytesize);
        return rc;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult cuMemFreeHost(void *p) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_host *h = sim_host_take((uintptr_t)p, 0);
    if (h == NULL) return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)h->ptr, h->size);
    free(h);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc != CUDA_SUCCESS) return rc;
    SIM_UNUSED(Flags); /* portable, device-map, I/O memory, read-only: all the same here */
    if (p == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return sim_host_track(p, bytesize, 1, ctx);
}

CUresult cuMemHostUnregister(void *p) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_host *h = sim_host_take((uintptr_t)p, 1);
    if (h == NULL) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(h);
    return CUDA_SUCCESS;
}

/* the pinned or registered range holding `p` */
static int sim_host_find(uintptr_t p, sim_host *out) {
    int found = 0;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_host *h = sim_hosts; h != NULL && !found; h = h->next) {
        if (p >= h->ptr && p - h->ptr < h->size) {
            *out = *h;
            found = 1;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    return found;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_host h;
    if (pdptr == NULL || Flags != 0 || !sim_host_find((uintptr_t)p, &h))
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

/* what a pointer query answers: the owning context, memory type, range and device */
typedef struct {
    sim_ctx *ctx;
    CUmemorytype type;
    uintptr_t start;
    size_t size;
    int managed;
} sim_pointer;

static int sim_pointer_info(uintptr_t p, sim_pointer *out) {
    sim_mem m;
    sim_host h;
    if (sim_linear_find(p, &m)) {
        *out = (sim_pointer){m.ctx, CU_MEMORYTYPE_DEVICE, m.ptr, m.size, m.managed};
        return 1;
    }
    if (sim_host_find(p, &h)) {
        *out = (sim_pointer){h.ctx, CU_MEMORYTYPE_HOST, h.ptr, h.size, 0};
        return 1;
    }
    return 0;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_pointer info;
    if (data == NULL || !sim_pointer_info((uintptr_t)ptr, &info)) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)info.ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = info.type; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (info.type == CU_MEMORYTYPE_DEVICE && !info.managed)
            return CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = info.ctx->ordinal; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = info.start; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = info.size; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = (unsigned int)info.managed; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_mem m;
    if (!sim_linear_find((uintptr_t)dptr, &m)) return CUDA_ERROR_NOT_FOUND;
    if (pbase != NULL) *pbase = (CUdeviceptr)m.ptr;
    if (psize != NULL) *psize = m.size;
    return CUDA_SUCCESS;
}
