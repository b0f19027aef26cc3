/*
 * The shared region of one share: a file (GPUPOOL_SHARED_REGION) mapped MAP_SHARED by every
 * process of the share (native/shim/region.c says how it is used).
 *
 * Python reads it (src/gpupool/isolation/region.py: the share's id, and its counters of refused
 * allocations and of time held back, for /metrics) at the offsets written here; a test compares
 * them with this header. The layout is little-endian: change both together and bump
 * GPUPOOL_REGION_VERSION.
 */
#ifndef GPUPOOL_REGION_H
#define GPUPOOL_REGION_H

#include <pthread.h>
#include <stdint.h>

#define GPUPOOL_REGION_MAGIC 0x314e474552505047ULL /* "GPPREGN1" read as little-endian u64 */
#define GPUPOOL_REGION_VERSION 4u
#define GPUPOOL_REGION_DEVICES 16
#define GPUPOOL_REGION_PROCS 256
#define GPUPOOL_REGION_SPANS 16

/* One live process of the share. pid 0: a free slot. */
typedef struct {
    int32_t pid; /* 0 = free */
    uint32_t pad;
    uint64_t start_time; /* /proc/PID/stat field 22, guards against pid reuse */
    uint64_t used[GPUPOOL_REGION_DEVICES];
} gpupool_region_proc;

typedef struct {
    uint64_t start, end; /* end 0 = unused */
} gpupool_region_span;

/* What held the share's launches back on one device, and its refused allocations: only ever
 * added to (relaxed atomics, no lock), read by the daemon at each scrape. */
typedef struct {
    uint64_t refused;       /* allocations refused over the memory share */
    uint64_t cap_wait_ns;   /* launches slept for the compute cap (the share's bucket in debt) */
    uint64_t lease_wait_ns; /* launches waited for the GPU's lease (another share held it) */
} gpupool_region_counters;

/* The daemon asks (control, control_seq: pwrite by the daemon, the share's processes only read);
 * each process of the share answers in its slot's ack (the seq it carried out, and its state).
 * The share is suspended when every live process's ack holds the daemon's seq and SUSPENDED. */
#define GP_ELASTIC_RUN 0u
#define GP_ELASTIC_SUSPEND 1u
#define GP_ACK_RUNNING 0u
#define GP_ACK_SUSPENDED 1u
#define GP_ACK_WAITING 2u /* asked to resume: the GPU has no room for it yet */

typedef struct {
    uint32_t control; /* GP_ELASTIC_RUN or _SUSPEND */
    uint32_t pad;
    uint64_t control_seq; /* bumped by the daemon with each request */
    /* bytes of the share in host memory (suspended), and in its burst beyond memory_limit */
    uint64_t host_bytes[GPUPOOL_REGION_DEVICES];
    uint64_t burst_limit[GPUPOOL_REGION_DEVICES]; /* bytes allowed past memory_limit, host-backed */
    uint64_t burst_used[GPUPOOL_REGION_DEVICES];
    /* the daemon's budget for the burst on the GPU (the rest of the burst stays in host memory),
     * and the burst bytes on the GPU now */
    uint64_t burst_device[GPUPOOL_REGION_DEVICES];
    uint64_t burst_on_device[GPUPOOL_REGION_DEVICES];
    uint64_t ack_seq[GPUPOOL_REGION_PROCS];   /* per process slot */
    uint32_t ack_state[GPUPOOL_REGION_PROCS]; /* GP_ACK_* */
} gpupool_region_elastic;

typedef struct {
    uint64_t magic;    /* 0  GPUPOOL_REGION_MAGIC, written last, once the rest is initialised */
    uint32_t version;  /* 8  GPUPOOL_REGION_VERSION */
    uint32_t size;     /* 12 sizeof(gpupool_region) */
    uint64_t share_id; /* 16 random: tells this share from others in the GPUs' arbiters */
    uint32_t policy;   /* 24 */
    uint32_t pad;
    uint64_t memory_limit[GPUPOOL_REGION_DEVICES];            /* 32 */
    uint32_t compute_limit[GPUPOOL_REGION_DEVICES];           /* 160 */
    gpupool_region_counters counters[GPUPOOL_REGION_DEVICES]; /* 224 */
    union {
        pthread_mutex_t mutex; /* robust, process-shared */
        char pad[128];
    } lock;
    uint64_t used[GPUPOOL_REGION_DEVICES];
    int64_t credit_ns[GPUPOOL_REGION_DEVICES];     /* the share's compute bucket per device */
    uint64_t credit_at_ns[GPUPOOL_REGION_DEVICES]; /* when it was last refilled; 0 = never */
    /* recent busy time already paid, disjoint */
    gpupool_region_span spans[GPUPOOL_REGION_DEVICES][GPUPOOL_REGION_SPANS];
    gpupool_region_proc procs[GPUPOOL_REGION_PROCS];
    /* ---- elastic memory (native/shim/elastic.c): after everything above, so that the offsets
     * before it stay put ---- */
    gpupool_region_elastic elastic;
} gpupool_region;

#endif /* GPUPOOL_REGION_H */
