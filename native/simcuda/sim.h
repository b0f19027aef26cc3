/*
 * Internal declarations of the simulated CUDA driver (libgpupool-simcuda.so, installed as
 * libcuda.so.1). The driver serves the CUDA driver API over host memory; the shared node state
 * (gpupool_simstate.h) holds what all processes on the simulated node must agree on: each GPU's
 * memory in use and its kernel timeline.
 */
#ifndef GPUPOOL_SIMCUDA_SIM_H
#define GPUPOOL_SIMCUDA_SIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool_cuda.h"
#include "gpupool_settings.h"
#include "gpupool_simstate.h"

#define SIM_DRIVER_VERSION 12040
/* a stream holding more queued work than this blocks the next launch (a full hardware queue) */
#define SIM_QUEUE_LIMIT_NS 1000000000ull
/* the error a call on a GPU that fell off the bus gets */
#define SIM_LOST_ERROR CUDA_ERROR_DEVICE_UNAVAILABLE
#define SIM_VMM_GRANULARITY (2ull << 20)

#define SIM_MAGIC_CTX 0x47504331u
#define SIM_MAGIC_STREAM 0x47505331u
#define SIM_MAGIC_EVENT 0x47504531u
#define SIM_MAGIC_MODULE 0x47504d31u
#define SIM_MAGIC_FUNC 0x47504631u
#define SIM_MAGIC_MEM 0x47504131u
#define SIM_MAGIC_GRAPH 0x47504731u
#define SIM_MAGIC_EXEC 0x47505831u
#define SIM_MAGIC_POOL 0x47505031u

struct sim_ctx;

/* a graph's node: a kernel or a memory operation */
typedef struct sim_node {
    int kind; /* 0: kernel; otherwise a memory operation (memory.c's SIM_OP_*) */
    unsigned grid[3], block[3];
    CUdeviceptr dst;
    const void *src;
    uint32_t value;
    size_t count;
} sim_node;

typedef struct sim_graph {
    uint32_t magic;
    sim_node *nodes;
    size_t count, capacity;
} sim_graph;

typedef struct sim_stream {
    uint32_t magic;
    struct sim_ctx *ctx;
    unsigned int flags;
    int priority;
    uint64_t last_end_ns;      /* end of the last work queued here (guarded by the driver lock) */
    struct sim_graph *capture; /* the graph being captured, or NULL */
    struct sim_stream *next;
} sim_stream;

typedef enum { SIM_MEM_LINEAR, SIM_MEM_ARRAY, SIM_MEM_VMM } sim_mem_kind;

/* one counted piece of simulated device memory */
typedef struct sim_mem {
    uint32_t magic;
    sim_mem_kind kind;
    uintptr_t ptr; /* LINEAR: the host mapping */
    size_t size;   /* bytes counted against the GPU */
    int gpu;       /* physical index in state.bin */
    int fd;        /* VMM: the memfd backing it */
    int maps;      /* VMM: live cuMemMap mappings */
    int released;  /* VMM: cuMemRelease called */
    int managed;   /* LINEAR: from cuMemAllocManaged */
    int on_host;   /* LINEAR, managed: migrated to host memory, not counted against the GPU */
    struct sim_ctx *ctx;
    struct sim_mem *hnext;       /* LINEAR: hash chain */
    struct sim_mem *prev, *next; /* the owning context's list */
} sim_mem;

struct sim_event;

typedef struct sim_ctx {
    uint32_t magic;
    int ordinal; /* visible device ordinal (the CUdevice) */
    int gpu;     /* physical index in state.bin */
    int primary;
    int refcount; /* primary: retain count */
    int active;   /* primary: retained at least once and not released to zero */
    unsigned int flags;
    sim_stream null_stream;
    sim_stream *streams;
    struct sim_event *events;
    sim_mem *mems;
} sim_ctx;

typedef struct sim_event {
    uint32_t magic;
    sim_ctx *ctx;
    unsigned int flags;
    int recorded;
    int captured;
    uint64_t time_ns;
    struct sim_event *next; /* the owning context's list */
} sim_event;

/* the process-wide driver state */
typedef struct sim_globals {
    pthread_mutex_t mu; /* guards handle lists and tables of this process */
    int initialized;
    CUresult init_result;
    uint8_t *map;
    int count;                         /* visible devices */
    int phys[GPUPOOL_SIM_MAX_DEVICES]; /* ordinal -> device number in state.bin */
    uint64_t dur_num, dur_den;         /* kernel ns = threads * dur_num / dur_den */
    int slot[GPUPOOL_SIM_MAX_DEVICES]; /* this process's slot per device number, -1 none */
    int pid;
    uint64_t start_time;
    sim_ctx *primary[GPUPOOL_SIM_MAX_DEVICES];
} sim_globals;

extern sim_globals g_sim;

/* state.c */
CUresult sim_attach_node(void); /* cuInit's first part: the node's state, this process's slot */
CUresult sim_require_init(void);
uint64_t sim_now_ns(void);
void sim_sleep_until(uint64_t deadline_ns);
gpupool_sim_header *sim_header(void);
gpupool_sim_gpu *sim_gpu(int phys);
int sim_gpu_lost(int phys);
void sim_driver_lock(void);
void sim_driver_unlock(void);
gpupool_sim_proc *sim_slot_locked(int phys);
int sim_reclaim_dead_locked(void);
/* `size` more on a GPU, within the GPU and `process_limit` (this process's bytes; 0: none) */
CUresult sim_memory_reserve(int phys, size_t size, uint64_t process_limit);
void sim_memory_release(int phys, size_t size);
gpupool_sim_proc *sim_proc(int slot);
uint64_t sim_on_device_ns(int phys, uint64_t duration_ns);
uint64_t sim_link_ns(int phys, uint64_t bytes);
/* a copy over the host link: `st` NULL waits for it, else it is queued on the stream */
void sim_link_copy(sim_ctx *ctx, sim_stream *st, uint64_t bytes);
void sim_charge_locked(int phys, gpupool_sim_proc *slot, uint64_t busy_ns, uint64_t now);
uint64_t sim_timeline_queue(int phys, uint64_t *stream_end, uint64_t duration_ns);
void sim_complain(const char *fmt, const char *arg);
uint64_t sim_kernel_duration_ns(uint64_t threads);

/* device.c: per-SM limits of a GPU's architecture */
int sim_shared_per_sm(const gpupool_sim_gpu *rec);
int sim_threads_per_sm(const gpupool_sim_gpu *rec);

/* context.c */
sim_ctx *sim_current_ctx(void);
CUresult sim_current_ctx_checked(sim_ctx **out);
CUresult sim_device_checked(CUdevice dev);
sim_ctx *sim_primary(CUdevice dev); /* made at its first use; NULL: out of memory */
void sim_ctx_unbind(sim_ctx *ctx);  /* off this thread's context stack */
CUresult sim_resolve_stream(CUstream h, sim_stream **out);
CUresult sim_check_ctx(sim_ctx *ctx);
void sim_ctx_wait_blocking(sim_ctx *ctx);
void sim_ctx_link_mem(sim_ctx *ctx, sim_mem *m);

/* memory.c */
void sim_mem_teardown(sim_mem *m);
void sim_unlink_mem_locked(sim_mem *m); /* g_sim.mu held */
int sim_linear_find(uintptr_t p, sim_mem *out);
void sim_linear_set_place(uintptr_t ptr, int gpu, int on_host);
CUresult sim_memop_replay(int kind, CUdeviceptr dst, const void *src, uint32_t value, size_t count);

/* host.c */
void sim_host_release_ctx(sim_ctx *ctx);

/* mps.c: the client side of MPS, served by gpupool's twin of the control daemon */
CUresult sim_mps_connect(void);
int sim_mps_active(void);
int sim_mps_server_gone(void);
uint64_t sim_mps_queue(int phys, uint64_t *stream_end, uint64_t duration_ns, uint64_t blocks);
uint64_t sim_mps_pinned(int phys); /* this client's pinned memory limit on a GPU; 0: none */

/* graph.c */
sim_graph *sim_graph_new(uint32_t magic);
sim_graph *sim_graph_of(void *h, uint32_t magic); /* NULL: not a graph of that kind */
CUresult sim_graph_append(sim_graph *g, const sim_node *node);
void sim_graph_free(sim_graph *graph);
CUresult sim_capture_memop(sim_stream *st, int kind, CUdeviceptr dst, const void *src,
                           uint32_t value, size_t count);

#define SIM_UNUSED(x) ((void)(x))

#endif /* GPUPOOL_SIMCUDA_SIM_H */
