/*
 * The trusted compute arbiter (native/arbiterd): one process per node that owns the lease of
 * every GPU, and what its clients (the interception library, the daemon) see of it.
 *
 * Its runtime directory (GPUPOOL_ARBITER_DIR), owned by the arbiter's user and writable by
 * nobody else, holds:
 * - lease.sock: SOCK_SEQPACKET, open to every user; a share's process says which share it is
 *   (HELLO with the share's id and key) and the kernel says which user it is (SO_PEERCRED);
 * - control.sock: SOCK_SEQPACKET, for the arbiter's own user and root only (the daemon): it
 *   registers each share it launches, with the share's user, GPU, weight, priority and policy;
 * - gpu-<the GPU UUID's 32 hex digits>: each GPU's view, written only by the arbiter, mapped
 *   read-only by the shares (who holds the lease, who is asked to give it back, each share's
 *   charged time) and read by Python (src/gpupool/isolation/arbiter.py) at the offsets below;
 *   a test compares them. Little-endian: change both together and bump GPUPOOL_ARBITER_VERSION.
 * docs/protocols/arbiter.md describes the protocol.
 */
#ifndef GPUPOOL_ARBITER_H
#define GPUPOOL_ARBITER_H

#include <stdint.h>

#define GPUPOOL_ARBITER_MAGIC 0x3242524150505047ULL /* "GPPARB2" read as little-endian u64 */
#define GPUPOOL_ARBITER_VERSION 6u
#define GPUPOOL_ARBITER_SHARES 64
#define GPUPOOL_ARBITER_CLIENTS 256
#define GPUPOOL_ARBITER_SOCKET "lease.sock"
#define GPUPOOL_ARBITER_CONTROL "control.sock"
#define GPUPOOL_ARBITER_VIEW_PREFIX "gpu-"
/* a share registered for any user (a Kubernetes pod: its container's uid is its image's) */
#define GPUPOOL_ARBITER_ANY_UID 0xffffffffu

/* message kinds: a client's, the daemon's (control), the arbiter's answers */
#define GPUPOOL_ARB_HELLO 1u       /* share_id, key, uuid; one memfd (the beat page) attached */
#define GPUPOOL_ARB_ACQUIRE 2u     /* answered by GRANT when the lease is this process's */
#define GPUPOOL_ARB_RELEASE 3u     /* value: the lease given back */
#define GPUPOOL_ARB_REST 4u        /* asleep for its cap: not wanting the GPU for now */
#define GPUPOOL_ARB_REGISTER 16u   /* share_id, key, uuid, arg: uid, value: GPUPOOL_ARB_TERMS */
#define GPUPOOL_ARB_UNREGISTER 17u /* share_id (every GPU of it) */
#define GPUPOOL_ARB_WEIGHT 18u     /* share_id, value: the new weight (percent 1..100) */
#define GPUPOOL_ARB_OK 32u         /* arg: the slot (HELLO), the slots changed (control) */
#define GPUPOOL_ARB_GRANT 33u      /* value: the lease's id */
#define GPUPOOL_ARB_REFUSED 34u    /* arg: GPUPOOL_ARB_WHY_* */

#define GPUPOOL_ARB_WHY_UNKNOWN 1u /* no such share on that GPU */
#define GPUPOOL_ARB_WHY_USER 2u    /* the share is another user's */
#define GPUPOOL_ARB_WHY_FULL 3u    /* no slot left */
#define GPUPOOL_ARB_WHY_INVALID 4u /* a malformed request */

/* a registration's terms in one u64: weight | priority << 8 | policy << 16 | slice << 32 (bits
 * 24..31 zero); slice: the share's lease length in microseconds (0: the batch window, 20 ms) */
#define GPUPOOL_ARB_TERMS(weight, priority, policy, slice_us)                                      \
    ((uint64_t)(weight) | (uint64_t)(priority) << 8 | (uint64_t)(policy) << 16 |                   \
     (uint64_t)(slice_us) << 32)
/* the slices a registration may ask for: from one short kernel's hand-over to the yield limit */
#define GPUPOOL_ARB_SLICE_MIN_US 100u
#define GPUPOOL_ARB_SLICE_MAX_US 1000000u

typedef struct {
    uint32_t kind;     /* 0  GPUPOOL_ARB_* */
    uint32_t arg;      /* 4 */
    uint64_t share_id; /* 8 */
    uint64_t key;      /* 16 the share's secret, given to its processes only */
    uint64_t value;    /* 24 */
    uint8_t uuid[16];  /* 32 the GPU */
} gpupool_arbiter_msg;

/* A client process's beat: a sealed memfd page it writes and the arbiter maps read-only, so the
 * arbiter knows a holder has gone quiet without a message per launch. A client can only lie
 * about itself, and a lease asked back is taken after GP_YIELD_LIMIT_NS whatever it says. */
typedef struct {
    uint64_t last_launch_ns; /* CLOCK_MONOTONIC ns when its latest batch of launches opened */
    uint64_t busy_until_ns;  /* its estimate of when its queued work ends */
    /* its launches so far: counted, not timed (a clock read a launch is a measurable cost); the
     * arbiter takes a count that moved since it last looked for a launch made since then */
    uint64_t launches;
} gpupool_arbiter_beat;

/* One share on the GPU (all of its processes). share_id 0: a free slot. */
typedef struct {
    uint64_t share_id;  /* 0  the share's id (not its key) */
    uint32_t weight;    /* 8  its compute percent, 1..100 */
    uint32_t priority;  /* 12 0 none, 1 high, 2 low */
    uint64_t vtime;     /* 16 its virtual clock: leased ns x 100 / weight */
    uint64_t wanted_ns; /* 24 CLOCK_MONOTONIC ns when it last asked for the lease */
    uint64_t busy_ns;   /* 32 the lease time charged to it since it was registered */
    int32_t pid;        /* 40 the latest of its processes to ask for the lease */
    uint32_t policy;    /* 44 0 cap, 1 share */
    uint32_t uid;       /* 48 its user (GPUPOOL_ARBITER_ANY_UID: any) */
    uint32_t waiting;   /* 52 its processes waiting for the lease now */
    uint32_t resting;   /* 56 1: asleep for its cap */
    uint32_t clients;   /* 60 its connected processes */
    uint32_t slice_us;  /* 64 its lease length as registered (0: the batch window) */
    uint32_t reserved;  /* 68 */
} gpupool_arbiter_share;

/* One connected process (the watchdog's list of processes that ask for leases). pid 0: free. */
typedef struct {
    int32_t pid;    /* 0  in the arbiter's pid namespace */
    uint32_t slot;  /* 4  its share's slot */
    uint64_t start; /* 8  /proc/PID/stat start time */
} gpupool_arbiter_client;

typedef struct {
    uint64_t magic;       /* 0  GPUPOOL_ARBITER_MAGIC, written last */
    uint32_t version;     /* 8  GPUPOOL_ARBITER_VERSION */
    uint32_t size;        /* 12 sizeof(gpupool_arbiter_view) */
    uint64_t lease;       /* 16 the current lease's id; 0: free */
    uint64_t yield_lease; /* 24 the lease asked to give way at its next batch */
    int32_t holder_pid;   /* 32 */
    uint32_t holder_slot; /* 36 */
    uint64_t granted_ns;  /* 40 */
    uint8_t uuid[16];     /* 48 the GPU */
    uint8_t reserved[64]; /* 64 */
    gpupool_arbiter_share share[GPUPOOL_ARBITER_SHARES];    /* 128 */
    gpupool_arbiter_client client[GPUPOOL_ARBITER_CLIENTS]; /* 4736 */
} gpupool_arbiter_view;

#endif /* GPUPOOL_ARBITER_H */
