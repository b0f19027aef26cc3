/*
 * Calls NVML's memory queries directly (linked to libnvidia-ml.so.1, no dlsym), so the
 * interception library's exported symbols answer them. Prints, per NVML index 0 and 1:
 * "INDEX TOTAL USED FREE" from nvmlDeviceGetMemoryInfo.
 */
#include <stdio.h>

#include "gpupool_nvml.h"

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);

int main(void) {
    if (nvmlInit_v2() != NVML_SUCCESS) return 1;
    for (unsigned int index = 0; index < 2; index++) {
        nvmlDevice_t device;
        nvmlMemory_t memory;
        if (nvmlDeviceGetHandleByIndex_v2(index, &device) != NVML_SUCCESS) return 1;
        if (nvmlDeviceGetMemoryInfo(device, &memory) != NVML_SUCCESS) return 1;
        printf("%u %llu %llu %llu\n", index, memory.total, memory.used, memory.free);
    }
    return 0;
}
