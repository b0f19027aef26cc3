/*
 * Elastic memory in the simulated driver: managed memory migrates between the GPU and host memory
 * (cuMemPrefetchAsync), counted against the GPU only while it is on the GPU. The data itself never
 * moves: it lives in host memory all along, so a migration costs only its simulated time.
 */
#define _GNU_SOURCE
#include "sim.h"

/* Moves the managed allocations holding [devPtr, devPtr+count) to host memory (CU_DEVICE_CPU) or
 * to a device, whole allocations at a time. To a GPU without room, the memory stays on the host
 * and the call succeeds, as a real prefetch leaves pages where they are under oversubscription. */
CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                            CUstream hStream) {
    sim_stream *st;
    CUresult rc = sim_resolve_stream(hStream, &st);
    if (rc != CUDA_SUCCESS) return rc;
    if (count == 0) return CUDA_ERROR_INVALID_VALUE;
    if (dstDevice != CU_DEVICE_CPU && (dstDevice < 0 || dstDevice >= g_sim.count))
        return CUDA_ERROR_INVALID_DEVICE;
    int to_phys = dstDevice == CU_DEVICE_CPU ? -1 : g_sim.phys[dstDevice];
    uintptr_t p = (uintptr_t)devPtr, end = p + count;
    uint64_t moved = 0;
    while (p < end) {
        sim_mem found;
        if (!sim_linear_find(p, &found) || !found.managed) return CUDA_ERROR_INVALID_VALUE;
        uintptr_t next = found.ptr + found.size;
        int on_host = found.on_host, gpu = found.gpu;
        if (to_phys < 0 && !on_host) {
            sim_memory_release(gpu, found.size);
            on_host = 1;
            moved += found.size;
        } else if (to_phys >= 0 && (on_host || gpu != to_phys)) {
            if (sim_gpu_lost(to_phys)) return SIM_LOST_ERROR;
            if (sim_memory_reserve(to_phys, found.size, sim_mps_pinned(to_phys)) == CUDA_SUCCESS) {
                if (!on_host) sim_memory_release(gpu, found.size);
                on_host = 0;
                gpu = to_phys;
                moved += found.size;
            }
        }
        sim_linear_set_place(found.ptr, gpu, on_host);
        p = next;
    }
    sim_link_copy(st->ctx, st, moved);
    return CUDA_SUCCESS;
}
