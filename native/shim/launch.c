/*
 * The launch entry points: each passes through the compute throttle (throttle.c), and is counted,
 * so that a launch path the share misses shows up as a count (GPUPOOL_LOG_LEVEL=info prints them
 * at exit), not only as a timing.
 */
#include <stdio.h>
#include <string.h>

#include "shim.h"

#define GP_LAUNCH_ENTRIES(X)                                                                       \
    X(cuLaunchKernel)                                                                              \
    X(cuLaunchKernel_ptsz)                                                                         \
    X(cuLaunchKernelEx)                                                                            \
    X(cuLaunchKernelEx_ptsz)                                                                       \
    X(cuLaunchCooperativeKernel)                                                                   \
    X(cuLaunchCooperativeKernel_ptsz)                                                              \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphLaunch_ptsz)

#define GP_ENTRY_ENUM(name) GP_ENTRY_##name,
enum { GP_LAUNCH_ENTRIES(GP_ENTRY_ENUM) GP_ENTRY_COUNT };
#define GP_ENTRY_NAME(name) #name,
static const char *const entry_names[GP_ENTRY_COUNT] = {GP_LAUNCH_ENTRIES(GP_ENTRY_NAME)};

/* launches per entry point, held (accounted to a compute share; per device, counted under its
 * throttle's lock: no locked add a launch) or passed straight through (one atomic add),
 * seen = held + passed */
static uint64_t held[GP_MAX_DEVICES][GP_ENTRY_COUNT], passed[GP_ENTRY_COUNT];

void gp_launch_after_fork(void) {
    memset(held, 0, sizeof held);
    memset(passed, 0, sizeof passed);
}

void gp_launch_report(void) {
    if (gp_log_threshold < GP_LOG_INFO) return;
    char line[768];
    size_t len = 0;
    for (int i = 0; i < GP_ENTRY_COUNT; i++) {
        uint64_t n_held = 0;
        for (int dev = 0; dev < GP_MAX_DEVICES; dev++)
            n_held += __atomic_load_n(&held[dev][i], __ATOMIC_RELAXED);
        uint64_t n = n_held + __atomic_load_n(&passed[i], __ATOMIC_RELAXED);
        if (n == 0) continue;
        int m = snprintf(line + len, sizeof line - len, "%s %s %llu (%llu held)", len ? "," : "",
                         entry_names[i], (unsigned long long)n, (unsigned long long)n_held);
        if (m < 0 || (size_t)m >= sizeof line - len) break;
        len += (size_t)m;
    }
    gp_log(GP_LOG_INFO, "launches seen:%s", len ? line : " none");
}

/* A runtime can fetch private tables of driver functions by id, past every public entry point:
 * named at log level info, so that a launch path none of the counts above sees can be traced to
 * the table it came through. */
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    __typeof__(&cuGetExportTable) real = GP_REAL(cuGetExportTable);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(ppExportTable, pExportTableId);
    if (pExportTableId != NULL && gp_log_threshold >= GP_LOG_INFO) {
        char hex[33];
        for (int i = 0; i < 16; i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)pExportTableId->bytes[i]);
        gp_log(GP_LOG_INFO, "cuGetExportTable(%s): %d", hex, (int)rc);
    }
    return rc;
}

#define THROTTLED(real_name, stream, ptsz, call)                                                   \
    do {                                                                                           \
        __typeof__(&real_name) real = GP_REAL(real_name);                                          \
        if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;                                       \
        /* a suspended share's launches wait here (one load when it is not) */                     \
        if (__builtin_expect(__atomic_load_n(&gp_elastic_closed, __ATOMIC_RELAXED), 0))            \
            gp_elastic_wait();                                                                     \
        gp_launch launch;                                                                          \
        gp_throttle_before(&launch, (stream), (ptsz));                                             \
        if (launch.dev >= 0) {                                                                     \
            uint64_t *count = &held[launch.dev][GP_ENTRY_##real_name];                             \
            __atomic_store_n(count, __atomic_load_n(count, __ATOMIC_RELAXED) + 1,                  \
                             __ATOMIC_RELAXED);                                                    \
        } else {                                                                                   \
            __atomic_add_fetch(&passed[GP_ENTRY_##real_name], 1, __ATOMIC_RELAXED);                \
        }                                                                                          \
        CUresult rc = real call;                                                                   \
        gp_throttle_after(&launch, rc);                                                            \
        return rc;                                                                                 \
    } while (0)

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    THROTTLED(cuLaunchKernel, hStream, 0,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams, extra));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra) {
    THROTTLED(cuLaunchKernel_ptsz, hStream, 1,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    THROTTLED(cuLaunchKernelEx, config ? config->hStream : NULL, 0,
              (config, f, kernelParams, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra) {
    THROTTLED(cuLaunchKernelEx_ptsz, config ? config->hStream : NULL, 1,
              (config, f, kernelParams, extra));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams) {
    THROTTLED(cuLaunchCooperativeKernel, hStream, 0,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams) {
    THROTTLED(cuLaunchCooperativeKernel_ptsz, hStream, 1,
              (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
               hStream, kernelParams));
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    THROTTLED(cuGraphLaunch, hStream, 0, (hGraphExec, hStream));
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    THROTTLED(cuGraphLaunch_ptsz, hStream, 1, (hGraphExec, hStream));
}
