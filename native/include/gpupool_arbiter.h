/*
 * The compute arbiter of one physical GPU: a node-wide file named gpupool-arbiter-<UUID's 32 hex
 * digits> in the arbiter directory (GPUPOOL_ARBITER_DIR), mapped MAP_SHARED by every process of
 * every compute share on that GPU (native/shim/arbiter.c says how it is used).
 *
 * Python reads it (src/gpupool/isolation/arbiter.py: each share's percent, priority and measured
 * GPU time, for `gpupool gpus` and `gpupool exec`) at the offsets written here; a test compares
 * them with this header. The layout is little-endian: change both together and bump
 * GPUPOOL_ARBITER_VERSION.
 */
#ifndef GPUPOOL_ARBITER_H
#define GPUPOOL_ARBITER_H

#include <pthread.h>
#include <stdint.h>

#define GPUPOOL_ARBITER_MAGIC 0x3142524150505047ULL /* "GPPARB1" read as little-endian u64 */
#define GPUPOOL_ARBITER_VERSION 3u
#define GPUPOOL_ARBITER_SHARES 64

/* One share on the GPU (all of its processes). share_id 0: a free slot. */
typedef struct {
    uint64_t share_id;  /* 0  the share's random id (its accounting region's) */
    uint32_t weight;    /* 8  its compute percent, 1..100 */
    uint32_t priority;  /* 12 0 none, 1 high, 2 low */
    uint64_t vtime;     /* 16 its virtual clock: GPU ns x 100 / weight */
    uint64_t wanted_ns; /* 24 CLOCK_MONOTONIC ns when it last asked for the lease */
    uint64_t busy_ns;   /* 32 the GPU time measured for it since it took the slot */
    int32_t pid;        /* 40 the latest of its processes to ask for the lease */
    uint32_t policy;    /* 44 0 cap, 1 share */
} gpupool_arbiter_share;

typedef struct {
    uint64_t magic;   /* 0  GPUPOOL_ARBITER_MAGIC, written last */
    uint32_t version; /* 8  GPUPOOL_ARBITER_VERSION */
    uint32_t size;    /* 12 sizeof(gpupool_arbiter_file) */
    union {
        pthread_mutex_t mutex; /* robust, process-shared */
        char pad[128];
    } lock;                  /* 16 */
    int32_t holder_pid;      /* 144 the process holding the lease; 0: free */
    uint32_t holder_slot;    /* 148 its share's slot */
    uint64_t holder_start;   /* 152 /proc/PID/stat start time: a reused pid is not the holder */
    uint64_t granted_ns;     /* 160 when the lease was granted */
    uint64_t last_launch_ns; /* 168 the holder's latest launch */
    uint64_t busy_until_ns;  /* 176 the holder's estimate of when its queued work ends */
    uint32_t turn;           /* 184 bumped when the lease may have become takeable: a futex */
    uint32_t reserved;       /* 188 */
    gpupool_arbiter_share share[GPUPOOL_ARBITER_SHARES]; /* 192 */
} gpupool_arbiter_file;

#endif /* GPUPOOL_ARBITER_H */
