/*
 * A stand-in libnvidia-ml.so.1 for the interception library's NVML tests: two GPUs of 80 GiB,
 * 5 GiB of each in use by other processes, at NVML indices 0 and 1. Only the calls the tests
 * make are here.
 */
#include <stdio.h>
#include <string.h>

#include "gpupool_nvml.h"

#define GIB (1ULL << 30)

static const char *const uuids[] = {"GPU-00000000-1111-2222-3333-444444444444",
                                    "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"};

static int index_of(nvmlDevice_t device) {
    unsigned long i = (unsigned long)device - 1;
    return i < 2 ? (int)i : -1;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= 2) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(unsigned long)(index + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(uuids[i]) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, uuids[i]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (index_of(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = 80 * GIB;
    memory->used = 5 * GIB;
    memory->free = 75 * GIB;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (index_of(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = 80 * GIB;
    memory->reserved = GIB / 2;
    memory->used = 5 * GIB;
    memory->free = 75 * GIB - GIB / 2;
    return NVML_SUCCESS;
}
