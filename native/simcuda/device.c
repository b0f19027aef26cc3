/* Device enumeration and queries, the driver version and error strings of the simulated driver. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} sim_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
     "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
     "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     "too many blocks in cooperative launch"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not initiated in this stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof sim_errors / sizeof sim_errors[0]; i++) {
        if (sim_errors[i].code == error) {
            *pStr = sim_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof sim_errors / sizeof sim_errors[0]; i++) {
        if (sim_errors[i].code == error) {
            *pStr = sim_errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDriverGetVersion(int *driverVersion) {
    if (driverVersion == NULL) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = g_sim.count;
    return CUDA_SUCCESS;
}

/* the device's record, after the checks every device query makes */
static CUresult sim_device(CUdevice dev, gpupool_sim_gpu **out) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (dev < 0 || dev >= g_sim.count) return CUDA_ERROR_INVALID_DEVICE;
    if (sim_gpu_lost(g_sim.phys[dev])) return SIM_LOST_ERROR;
    *out = sim_gpu(g_sim.phys[dev]);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult rc = sim_require_init();
    if (rc != CUDA_SUCCESS) return rc;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_sim.count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    gpupool_sim_gpu *rec;
    CUresult rc = sim_device(dev, &rec);
    if (rc != CUDA_SUCCESS) return rc;
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%.*s", (int)sizeof rec->name, rec->name);
    return CUDA_SUCCESS;
}

static int sim_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    gpupool_sim_gpu *rec;
    CUresult rc = sim_device(dev, &rec);
    if (rc != CUDA_SUCCESS) return rc;
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": 32 hex digits after the prefix */
    const char *p = strncmp(rec->uuid, "GPU-", 4) == 0 ? rec->uuid + 4 : rec->uuid;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    for (int nibble = 0; nibble < 32 && *p != '\0'; p++) {
        int v = sim_hex(*p);
        if (v < 0) continue;
        uuid->bytes[nibble / 2] = (char)(uuid->bytes[nibble / 2] | (v << (nibble % 2 ? 0 : 4)));
        nibble++;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    gpupool_sim_gpu *rec;
    CUresult rc = sim_device(dev, &rec);
    if (rc != CUDA_SUCCESS) return rc;
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    *bytes = rec->memory_total;
    return CUDA_SUCCESS;
}

/* "00000000:17:00.0" (NVML's form) or "0000:17:00.0" -> domain, bus, device */
static void sim_pci_parts(const gpupool_sim_gpu *rec, unsigned *domain, unsigned *bus,
                          unsigned *device) {
    *domain = *bus = *device = 0;
    if (sscanf(rec->pci_bus_id, "%x:%x:%x", domain, bus, device) != 3) *domain = *bus = *device = 0;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    gpupool_sim_gpu *rec;
    CUresult rc = sim_device(dev, &rec);
    if (rc != CUDA_SUCCESS) return rc;
    if (pciBusId == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned domain, bus, device;
    sim_pci_parts(rec, &domain, &bus, &device);
    snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.0", domain & 0xffffu, bus, device);
    return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    gpupool_sim_gpu *rec;
    CUresult rc = sim_device(dev, &rec);
    if (rc != CUDA_SUCCESS) return rc;
    if (major == NULL || minor == NULL) return CUDA_ERROR_INVALID_VALUE;
    *major = (int)rec->cc_major;
    *minor = (int)rec->cc_minor;
    return CUDA_SUCCESS;
}

/* Per-SM limits by architecture (CUDA C Programming Guide, compute capabilities table). */
int sim_shared_per_sm(const gpupool_sim_gpu *rec) {
    if (rec->cc_major >= 9) return 233472;
    if (rec->cc_major == 8 && rec->cc_minor == 0) return 167936;
    return 102400;
}

int sim_threads_per_sm(const gpupool_sim_gpu *rec) {
    return rec->cc_major == 8 && rec->cc_minor != 0 ? 1536 : 2048;
}

static int sim_attribute(const gpupool_sim_gpu *rec, CUdevice_attribute attrib) {
    unsigned domain, bus, device;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return rec->cc_major >= 9 ? 1980000 : 1410000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return (int)rec->sm_count;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        sim_pci_parts(rec, &domain, &bus, &device);
        return (int)bus;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        sim_pci_parts(rec, &domain, &bus, &device);
        return (int)device;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        sim_pci_parts(rec, &domain, &bus, &device);
        return (int)domain;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return rec->cc_major >= 9 ? 2619000 : 1593000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return rec->cc_major >= 9 ? 52428800 : 41943040;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return sim_threads_per_sm(rec);
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return (int)rec->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return (int)rec->cc_minor;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return sim_shared_per_sm(rec);
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        return sim_shared_per_sm(rec) - 1024;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    default: return 0; /* capabilities the simulation does not model: absent */
    }
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    gpupool_sim_gpu *rec;
    CUresult rc = sim_device(dev, &rec);
    if (rc != CUDA_SUCCESS) return rc;
    /* cuda.h numbers attributes from 1 up (134 in CUDA 12.4, more in 13); a newer runtime may ask
     * for ones this simulation does not know, which read as absent (0), not as errors */
    if (pi == NULL || (int)attrib < 1 || (int)attrib >= 256) return CUDA_ERROR_INVALID_VALUE;
    *pi = sim_attribute(rec, attrib);
    return CUDA_SUCCESS;
}
