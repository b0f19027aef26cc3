/*
 * The GPUPOOL_* environment variables the C libraries read, one macro each.
 *
 * The whole list, with defaults and what each one does, is src/gpupool/core/settings.py; a test
 * (tests/test_settings.py) keeps the two equal, so a variable is never read here that the Python
 * side does not know to set, drop or document.
 */
#ifndef GPUPOOL_SETTINGS_H
#define GPUPOOL_SETTINGS_H

#define GP_ENV_MEMORY_LIMIT "GPUPOOL_MEMORY_LIMIT"   /* also _<n> per device ordinal */
#define GP_ENV_COMPUTE_LIMIT "GPUPOOL_COMPUTE_LIMIT" /* also _<n> per device ordinal */
#define GP_ENV_COMPUTE_POLICY "GPUPOOL_COMPUTE_POLICY"
#define GP_ENV_COMPUTE_PRIORITY "GPUPOOL_COMPUTE_PRIORITY"
#define GP_ENV_ELASTIC "GPUPOOL_ELASTIC"           /* 1: allocations can be suspended */
#define GP_ENV_MEMORY_BURST "GPUPOOL_MEMORY_BURST" /* bytes past the limit, host-backed */
#define GP_ENV_SHARED_REGION "GPUPOOL_SHARED_REGION"
#define GP_ENV_ARBITER_DIR "GPUPOOL_ARBITER_DIR"
#define GP_ENV_ARBITER_SHARE "GPUPOOL_ARBITER_SHARE"
#define GP_ENV_CONFIG_FILE "GPUPOOL_CONFIG_FILE"
#define GP_ENV_LOG_LEVEL "GPUPOOL_LOG_LEVEL"
#define GP_ENV_SIM_NODE "GPUPOOL_SIM_NODE"
#define GP_ENV_SIM_KERNEL_NS "GPUPOOL_SIM_KERNEL_NS"

#endif /* GPUPOOL_SETTINGS_H */
