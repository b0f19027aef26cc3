/*
 * NVML's memory queries, so that nvidia-smi and NVML-based tools inside the share report it:
 * total = the share's limit, used = what the whole share holds, free = the rest. NVML numbers
 * GPUs by their index on the node; the share's limits are per CUDA ordinal. Where the program has
 * initialised CUDA, the ordinal is found by UUID; otherwise it is the GPU's position in
 * CUDA_VISIBLE_DEVICES (by index or UUID prefix), or the index itself when that is unset.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim.h"

static int uuid_matches(const char *token, size_t len, const char *uuid) {
    return len >= 4 && strncmp(token, "GPU-", 4) == 0 && strncmp(uuid, token, len) == 0;
}

static void format_uuid(const CUuuid *uuid, char *out, size_t size) {
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* the CUDA ordinal whose UUID is `uuid`: -1 if none, -2 if CUDA is not initialised here (the
 * driver is not loaded by NOLOAD lookups, and cuDeviceGetCount fails before cuInit) */
static int ordinal_by_uuid(const char *uuid) {
    __typeof__(&cuDeviceGetCount) get_count = GP_REAL(cuDeviceGetCount);
    __typeof__(&cuDeviceGetUuid) get_uuid = GP_REAL(cuDeviceGetUuid);
    int count = 0;
    if (get_count == NULL || get_uuid == NULL || get_count(&count) != CUDA_SUCCESS) return -2;
    for (int dev = 0; dev < count && dev < GP_MAX_DEVICES; dev++) {
        CUuuid raw;
        char text[64];
        if (get_uuid(&raw, dev) != CUDA_SUCCESS) return -2;
        format_uuid(&raw, text, sizeof text);
        if (strcasecmp(text, uuid) == 0) return dev;
    }
    return -1;
}

/* the CUDA ordinal of an NVML device, or -1 when it is not visible to CUDA here */
static int cuda_ordinal(nvmlDevice_t device) {
    __typeof__(&nvmlDeviceGetIndex) get_index = GP_REAL_NVML(nvmlDeviceGetIndex);
    __typeof__(&nvmlDeviceGetUUID) get_uuid = GP_REAL_NVML(nvmlDeviceGetUUID);
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
    if (get_uuid != NULL && get_uuid(device, uuid, sizeof uuid) != NVML_SUCCESS) uuid[0] = '\0';
    if (uuid[0] != '\0') {
        int ordinal = ordinal_by_uuid(uuid);
        if (ordinal != -2) return ordinal;
    }
    unsigned int index = 0;
    if (get_index == NULL || get_index(device, &index) != NVML_SUCCESS) return -1;
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible == NULL) return index < GP_MAX_DEVICES ? (int)index : -1;
    int ordinal = 0;
    for (const char *token = visible; *token != '\0' && ordinal < GP_MAX_DEVICES; ordinal++) {
        size_t len = strcspn(token, ",");
        char *end = NULL;
        unsigned long n = strtoul(token, &end, 10);
        if (end == token + len && len > 0) {
            if (n == index) return ordinal;
        } else if (uuid[0] != '\0' && uuid_matches(token, len, uuid)) {
            return ordinal;
        } else if (len == 0 || strncmp(token, "GPU-", 4) != 0) {
            return -1; /* CUDA stops at the first entry it cannot read */
        }
        token += len;
        if (*token == ',') token++;
    }
    return -1;
}

/* the share's view of one device: 0 and the numbers when the device has a limit */
static int share_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *used) {
    int dev = cuda_ordinal(device);
    if (dev < 0) return -1;
    uint64_t limit = gp_region_memory_limit(dev);
    if (limit == 0) return -1;
    /* the effective limit needs the driver, which an NVML-only program may not load */
    if (*total != 0 && limit > *total) limit = *total;
    *total = limit;
    *used = gp_region_used(dev);
    return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    __typeof__(&nvmlDeviceGetMemoryInfo) real = GP_REAL_NVML(nvmlDeviceGetMemoryInfo);
    if (real == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    unsigned long long total = memory->total, used = 0;
    if (share_view(device, &total, &used) != 0) return rc;
    memory->total = total;
    memory->used = used < total ? used : total;
    memory->free = total - memory->used;
    return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) real = GP_REAL_NVML(nvmlDeviceGetMemoryInfo_v2);
    if (real == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    unsigned long long total = memory->total, used = 0;
    if (share_view(device, &total, &used) != 0) return rc;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used < total ? used : total;
    memory->free = total - memory->used;
    return rc;
}
