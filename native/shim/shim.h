/*
 * Internal declarations of libgpupool-cuda.so, the interception library of mode `shim`.
 *
 * The library is preloaded into a workload. It exports the CUDA driver and NVML entry points it
 * wraps under their own names (so direct calls bind to it), hooks dlsym and cuGetProcAddress (so
 * lookups by name get the wrappers too), and calls the real driver through pointers it resolves
 * itself. Everything declared between the visibility pragmas stays private to the library.
 */
#ifndef GPUPOOL_SHIM_H
#define GPUPOOL_SHIM_H

#include <stdint.h>

#include "gpupool_cuda.h"
#include "gpupool_nvml.h"
#include "gpupool_region.h"
#include "gpupool_settings.h"

/* per-thread default stream variants: cuda.h declares them only under a build flag */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);

#pragma GCC visibility push(hidden)

#define GP_MAX_DEVICES 16
#define GP_NS_PER_S 1000000000ULL
#define GP_NS_PER_MS 1000000ULL

/* ---- log.c ---------------------------------------------------------------------------------- */

typedef enum { GP_LOG_ERROR = 0, GP_LOG_WARN = 1, GP_LOG_INFO = 2, GP_LOG_DEBUG = 3 } gp_log_level;

extern gp_log_level gp_log_threshold;
void gp_log(gp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* one line on stderr, then exit status 2: the workload never runs without its limits */
void gp_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "3.9 GiB", "512 MiB", "17 B" */
void gp_format_bytes(uint64_t bytes, char *out, unsigned long size);
uint64_t gp_now_ns(void); /* CLOCK_MONOTONIC */
void gp_sleep_ns(uint64_t ns);

/* ---- config.c: GPUPOOL_* variables, read once at load -------------------------------------- */

typedef enum { GP_POLICY_CAP = 0, GP_POLICY_SHARE = 1 } gp_policy;
/* unset: arbitrated only with a compute limit; high and low: always (low runs in high's gaps) */
typedef enum { GP_PRIORITY_UNSET = 0, GP_PRIORITY_HIGH = 1, GP_PRIORITY_LOW = 2 } gp_priority;

typedef struct {
    uint64_t memory_limit[GP_MAX_DEVICES];  /* bytes, 0 = none */
    uint32_t compute_limit[GP_MAX_DEVICES]; /* percent 1..100, 100 = none */
    gp_policy policy;
    gp_priority priority;
    const char *region_path; /* NULL: this process alone */
    int elastic;             /* allocations are managed memory, so the share can be suspended */
    uint64_t memory_burst;   /* bytes per device past memory_limit, host-backed (elastic only) */
    const char *arbiter_dir; /* the trusted arbiter's runtime directory; NULL: none */
    uint64_t arbiter_share;  /* the share's id at the arbiter (GPUPOOL_ARBITER_SHARE) */
    uint64_t arbiter_key;    /* and its key; both 0: not arbitrated */
} gp_config;

void gp_config_load(gp_config *cfg);
/* Kubernetes quantities: "4Gi", "4GiB", "4G" (10^9), "512Mi", "1073741824" -> bytes; 0 on success,
 * -1 if malformed */
int gp_parse_bytes(const char *text, uint64_t *out);

/* ---- region.c: the share's accounting, shared by all its processes -------------------------- */

void gp_region_open(const gp_config *cfg);
void gp_region_close(void);
void gp_region_after_fork(void);
uint64_t gp_region_memory_limit(int dev);
uint32_t gp_region_compute_limit(int dev);
int gp_region_any_compute_limit(void);
gp_policy gp_region_policy(void);
uint64_t gp_region_share_id(void);
/* reserve `bytes` on `dev` under `limit` (0 = none); 0 if granted, -1 if it would pass it
 * (then *used_out holds the share's usage for the message) */
int gp_region_reserve(int dev, uint64_t bytes, uint64_t limit, uint64_t *used_out);
void gp_region_release(int dev, uint64_t bytes);
uint64_t gp_region_used(int dev);
/* elastic memory's part of the region (gpupool_region.h), NULL before it is open */
gpupool_region_elastic *gp_region_elastic(void);
int gp_region_slot(void); /* this process's slot, -1 before its first reservation */
int gp_region_burst_reserve(int dev, uint64_t bytes);
void gp_region_burst_release(int dev, uint64_t bytes);
/* the share's compute bucket on `dev`: refill X % of the time since the last call (up to cap_ns),
 * pay for the GPU busy from busy_start to busy_end (what the share has not paid yet), return
 * what is left (negative: in debt) */
int64_t gp_region_credit(int dev, uint32_t percent, uint64_t now, int64_t cap_ns,
                         uint64_t busy_start, uint64_t busy_end);
/* the share's counters on `dev`, exported per job by the daemon */
typedef enum { GP_WAIT_CAP = 0, GP_WAIT_LEASE = 1 } gp_wait_reason;
void gp_region_count_refusal(int dev);
/* `ns` a launch was held back: sleeping for the cap, or waiting for the GPU's lease */
void gp_region_count_wait(int dev, gp_wait_reason reason, uint64_t ns);

/* ---- ptrmap.c: what each live allocation holds, to credit its free -------------------------- */

typedef enum {
    GP_KIND_DEVPTR = 1,
    GP_KIND_ARRAY = 2,
    GP_KIND_MIPMAP = 3,
    GP_KIND_MEMHANDLE = 4,
    GP_KIND_BURST = 5 /* managed memory past the share's limit, counted in its burst */
} gp_alloc_kind;

void gp_ptrmap_put(uint64_t key, gp_alloc_kind kind, int dev, uint64_t size, uint64_t ctx);
/* removes the entry; 0 and its device, size and context if there was one, -1 if not */
int gp_ptrmap_take(uint64_t key, gp_alloc_kind kind, int *dev, uint64_t *size, uint64_t *ctx);
/* forgets every allocation of a destroyed context, calling `release` for each */
void gp_ptrmap_drop_context(uint64_t ctx, void (*release)(int dev, uint64_t bytes));
void gp_ptrmap_reset(void);
typedef struct {
    uint64_t key, ctx, size;
    int dev;
    gp_alloc_kind kind;
} gp_ptrmap_item;
/* a copy of the live allocations (malloc'd, *count of them; NULL if none or out of memory) */
gp_ptrmap_item *gp_ptrmap_snapshot(size_t *count);

/* ---- real.c: the real driver and NVML, dlsym and cuGetProcAddress hooks --------------------- */

/* the real entry point `name` of libcuda (or NULL) */
void *gp_real_cuda(const char *name);
void *gp_real_nvml(const char *name);
void *gp_real_cached(void *volatile *slot, const char *name, int nvml);
void *gp_real_dlsym(void *handle, const char *name);

#define GP_REAL(name)                                                                              \
    ({                                                                                             \
        static void *volatile gp_slot_##name;                                                      \
        /* resolved once: a load at every later call, not a call */                                \
        void *gp_fn_##name = __atomic_load_n(&gp_slot_##name, __ATOMIC_ACQUIRE);                   \
        (__typeof__(&name))(gp_fn_##name ? gp_fn_##name                                            \
                                         : gp_real_cached(&gp_slot_##name, #name, 0));             \
    })
#define GP_REAL_NVML(name)                                                                         \
    ({                                                                                             \
        static void *volatile gp_slot_##name;                                                      \
        (__typeof__(&name))gp_real_cached(&gp_slot_##name, #name, 1);                              \
    })

/* ---- memory.c ------------------------------------------------------------------------------ */

/* the calling thread's current context (0: none) and its device (-1: none, or not one we track) */
int gp_current_device_and_context(uint64_t *ctx_out);
/* the share's effective limit on `dev` (clamped to the GPU's memory; 0 = none) */
uint64_t gp_memory_limit(int dev);
/* at exit: how many allocations were refused, when more than were logged */
void gp_memory_report_refusals(void);

/* ---- elastic.c: suspend, resume and burst, asked for by the daemon through the region ------ */

void gp_elastic_configure(const gp_config *cfg);
int gp_elastic_enabled(void);
/* starts the thread that carries out the daemon's requests (once per process, at its first
 * reservation: a process that holds no memory has nothing to move) */
void gp_elastic_start(void);
void gp_elastic_after_fork(void);
/* set while the share is suspended: launches and allocations wait in gp_elastic_wait */
extern int gp_elastic_closed;
void gp_elastic_wait(void);
/* an allocation waits while the share is suspended or being suspended */
void gp_elastic_gate(void);
/* a burst allocation was made (it goes to the host past the daemon's budget), or freed */
void gp_elastic_placed_burst(uint64_t ptr, uint64_t size, int dev, uint64_t ctx);
void gp_elastic_burst_freed(uint64_t ptr, uint64_t size, int dev);

/* ---- throttle.c: compute shares ------------------------------------------------------ */

typedef struct {
    int dev;    /* -1: not throttled, the launch passes straight through */
    int pushed; /* the stream's context was made current for the launch (none was) */
} gp_launch;

void gp_throttle_before(gp_launch *launch, CUstream stream, int is_ptsz);
void gp_throttle_after(gp_launch *launch, CUresult rc);
void gp_throttle_after_fork(void);
/* at exit, at log level info: launches seen per entry point, and how many the share held */
void gp_launch_report(void);
void gp_launch_after_fork(void);

/* ---- arbiter.c: a client of the node's trusted arbiter (native/arbiterd): one lease per GPU -- */

void gp_arbiter_configure(const gp_config *cfg);
gp_priority gp_arbiter_priority(void);
int gp_arbiter_active(int dev, uint64_t now);
/* wait until this process holds the GPU's lease (the arbiter grants it) */
void gp_arbiter_acquire(int dev);
/* the arbiter asked this process to give the lease back (or took it): drain, then release */
int gp_arbiter_should_yield(int dev, uint64_t now);
int gp_arbiter_holds(int dev);
/* a high-priority share asked for the GPU within the last 50 ms */
int gp_arbiter_high_active(int dev, uint64_t now);
void gp_arbiter_release(int dev);
/* the share sleeps for its cap: it does not want the GPU until it next asks for the lease */
void gp_arbiter_rest(int dev, uint64_t now);
/* a batch of about `estimate_ns` of GPU time opened at `now` */
void gp_arbiter_batch(int dev, uint64_t now, uint64_t estimate_ns);
/* the open batch may take one more launch: the lease is still held and not asked back */
int gp_arbiter_launch_ok(int dev);
/* one launch more (counted, not timed) */
void gp_arbiter_launched(int dev);
void gp_arbiter_close(void);
void gp_arbiter_after_fork(void);

#pragma GCC visibility pop

#endif /* GPUPOOL_SHIM_H */
