/*
 * The virtual-memory API of the simulated driver: physical handles (cuMemCreate) are memfds
 * counted against their GPU, mapped MAP_FIXED only inside ranges from cuMemAddressReserve; a
 * handle's memory goes back once it is released and no longer mapped, as in the real driver.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"

/* ---- the virtual-memory API ------------------------------------------------------------------ */

/* a mapped range (handle != NULL) or a reserved one (handle == NULL) */
typedef struct sim_mapping {
    uintptr_t ptr;
    size_t size;
    sim_mem *handle;
    struct sim_mapping *next;
} sim_mapping;
static sim_mapping *sim_mappings, *sim_reservations;

/* [ptr, ptr+size) lies inside one reservation: only there may cuMemMap map with MAP_FIXED */
static int sim_reserved_locked(uintptr_t ptr, size_t size) {
    for (sim_mapping *r = sim_reservations; r != NULL; r = r->next)
        if (ptr >= r->ptr && size <= r->size && ptr - r->ptr <= r->size - size) return 1;
    return 0;
}

/* no mapping overlaps [ptr, ptr+size) */
static int sim_unmapped_locked(uintptr_t ptr, size_t size) {
    for (sim_mapping *m = sim_mappings; m != NULL; m = m->next)
        if (ptr < m->ptr + m->size && m->ptr < ptr + size) return 0;
    return 1;
}

static CUresult sim_vmm_prop_check(const CUmemAllocationProp *prop) {
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= g_sim.count) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    CUresult rc = sim_require_init();
    if (rc == CUDA_SUCCESS) rc = sim_vmm_prop_check(prop);
    if (rc != CUDA_SUCCESS) return rc;
    if (granularity == NULL || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = SIM_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    sim_ctx *ctx;
    CUresult rc = sim_current_ctx_checked(&ctx);
    if (rc == CUDA_SUCCESS) rc = sim_vmm_prop_check(prop);
    if (rc != CUDA_SUCCESS) return rc;
    if (handle == NULL || flags != 0 || size == 0 || size % SIM_VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = g_sim.phys[prop->location.id];
    if (sim_gpu_lost(phys)) return SIM_LOST_ERROR;
    sim_mem *m = calloc(1, sizeof *m);
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_memory_reserve(phys, size, sim_mps_pinned(phys));
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->fd = memfd_create("gpupool-sim-vmm", MFD_CLOEXEC);
    if (m->fd < 0 || ftruncate(m->fd, (off_t)size) != 0) {
        if (m->fd >= 0) close(m->fd);
        sim_memory_release(phys, size);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->magic = SIM_MAGIC_MEM;
    m->kind = SIM_MEM_VMM;
    m->size = size;
    m->gpu = phys;
    sim_ctx_link_mem(ctx, m);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m;
    return CUDA_SUCCESS;
}

static sim_mem *sim_vmm_handle(CUmemGenericAllocationHandle handle) {
    sim_mem *m = (sim_mem *)(uintptr_t)handle;
    return m != NULL && m->magic == SIM_MAGIC_MEM && m->kind == SIM_MEM_VMM ? m : NULL;
}

/* the physical memory goes back once released and no longer mapped, as in the real driver */
static void sim_vmm_maybe_free_locked(sim_mem *m, sim_mem **to_free) {
    if (m->released && m->maps == 0) {
        sim_unlink_mem_locked(m);
        *to_free = m;
    }
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_mem *to_free = NULL;
    pthread_mutex_lock(&g_sim.mu);
    sim_mem *m = sim_vmm_handle(handle);
    if (m != NULL && !m->released) {
        m->released = 1;
        sim_vmm_maybe_free_locked(m, &to_free);
    } else {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_sim.mu);
    if (to_free != NULL) sim_mem_teardown(to_free);
    return rc;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (ptr == NULL || size == 0 || size % SIM_VMM_GRANULARITY != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > SIM_VMM_GRANULARITY ? alignment : SIM_VMM_GRANULARITY;
    /* over-reserve, then trim to an aligned range (the address hint is only a hint) */
    sim_mapping *reservation = calloc(1, sizeof *reservation);
    if (reservation == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    void *hint = (void *)(uintptr_t)addr;
    char *base =
        mmap(hint, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(reservation);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t start = ((uintptr_t)base + align - 1) & ~(uintptr_t)(align - 1);
    if (start > (uintptr_t)base) munmap(base, start - (uintptr_t)base);
    uintptr_t tail = start + size, end = (uintptr_t)base + size + align;
    if (end > tail) munmap((void *)tail, end - tail);
    reservation->ptr = start;
    reservation->size = size;
    pthread_mutex_lock(&g_sim.mu);
    reservation->next = sim_reservations;
    sim_reservations = reservation;
    pthread_mutex_unlock(&g_sim.mu);
    *ptr = (CUdeviceptr)start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_mapping *found = NULL;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_mapping **pp = &sim_reservations; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->ptr == (uintptr_t)ptr && (*pp)->size == size &&
            sim_unmapped_locked((uintptr_t)ptr, size)) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    if (found == NULL) /* not a whole reservation, or still mapped */
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)found->ptr, found->size);
    free(found);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    sim_mapping *map = calloc(1, sizeof *map);
    if (map == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_sim.mu);
    sim_mem *m = sim_vmm_handle(handle);
    if (m == NULL || m->released || ptr == 0 || size == 0 || flags != 0 || offset > m->size ||
        size > m->size - offset || size % SIM_VMM_GRANULARITY != 0 ||
        !sim_reserved_locked((uintptr_t)ptr, size))
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (!sim_unmapped_locked((uintptr_t)ptr, size))
        rc = CUDA_ERROR_ALREADY_MAPPED;
    else if (mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                  m->fd, (off_t)offset) == MAP_FAILED)
        rc = CUDA_ERROR_MAP_FAILED;
    if (rc == CUDA_SUCCESS) {
        m->maps++;
        map->ptr = (uintptr_t)ptr;
        map->size = size;
        map->handle = m;
        map->next = sim_mappings;
        sim_mappings = map;
    }
    pthread_mutex_unlock(&g_sim.mu);
    if (rc != CUDA_SUCCESS) free(map);
    return rc;
}

/* Unmaps every mapping inside [ptr, ptr+size) and puts the reservation back in its place. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
    sim_mem *to_free[64];
    int nfree = 0, found = 0;
    pthread_mutex_lock(&g_sim.mu);
    for (sim_mapping **pp = &sim_mappings; *pp != NULL;) {
        sim_mapping *map = *pp;
        if (map->ptr >= lo && map->ptr + map->size <= hi) {
            *pp = map->next;
            mmap((void *)map->ptr, map->size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            map->handle->maps--;
            sim_mem *freed = NULL;
            sim_vmm_maybe_free_locked(map->handle, &freed);
            if (freed != NULL && nfree < 64) to_free[nfree++] = freed;
            free(map);
            found = 1;
        } else {
            pp = &map->next;
        }
    }
    pthread_mutex_unlock(&g_sim.mu);
    for (int i = 0; i < nfree; i++) sim_mem_teardown(to_free[i]);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (ptr == 0 || size == 0 || desc == NULL || count == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.mu);
    int reserved = sim_reserved_locked((uintptr_t)ptr, size);
    pthread_mutex_unlock(&g_sim.mu);
    if (!reserved) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= g_sim.count)
            return CUDA_ERROR_INVALID_DEVICE;
    }
    int prot = desc[count - 1].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : desc[count - 1].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                           : PROT_NONE;
    return mprotect((void *)(uintptr_t)ptr, size, prot) == 0 ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_VALUE;
}
