/* The trusted compute arbiter's process: shared declarations of its parts, each calling only
 * the ones below it (main.c: sockets, connections and the loop; registry.c: views,
 * registrations, who each client is; lease.c: who holds each GPU's lease, and what it is
 * charged; core.c: the GPUs, the clock, the log and the answers that all of them use). */
#ifndef GPUPOOL_ARBITERD_H
#define GPUPOOL_ARBITERD_H

#include <stdint.h>
#include <sys/types.h>

#include "gpupool_arbiter.h"

#define ARB_MAX_GPUS 64
#define ARB_NS_PER_MS 1000000ULL

typedef enum { CONN_LEASE_LISTEN, CONN_CONTROL_LISTEN, CONN_CLIENT, CONN_CONTROL } conn_kind;

struct gpu;

typedef struct conn {
    int fd;
    conn_kind kind;
    uid_t uid;
    pid_t pid;
    uint64_t start;
    struct gpu *gpu; /* a client: its GPU, once its HELLO was accepted */
    int slot;        /* its share's slot */
    int client;      /* its entry in the view's client table */
    const gpupool_arbiter_beat *beat;
    uint64_t seen_launches, seen_ns; /* its beat's launch count when it last moved, and when */
    int waiting;                     /* an ACQUIRE not yet granted */
    int warned;                      /* said once what was wrong with what it sent */
} conn;

/* the registration of a share on a GPU, beyond what its view slot shows */
typedef struct {
    uint64_t key;
    conn *owner; /* the control connection that registered it; NULL once that one closed */
} slot_private;

typedef struct gpu {
    uint8_t uuid[16];
    gpupool_arbiter_view *view;
    slot_private priv[GPUPOOL_ARBITER_SHARES];
    conn *clients[GPUPOOL_ARBITER_CLIENTS];
    conn *holder;
    uint64_t yield_at; /* when the holder was asked to give the lease back */
} gpu;

/* core.c */
extern gpu gpus[ARB_MAX_GPUS];
extern int gpu_count;
extern int dir_fd; /* the runtime directory */

uint64_t now_ns(void);
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* the answer to a client or a control connection; -1 if it could not be sent */
int answer(conn *c, uint32_t kind, uint32_t arg, uint64_t value);

/* registry.c */
gpu *find_gpu(const uint8_t uuid[16], int create); /* created: its view made afresh */
void free_slot(gpu *g, int slot);
int on_control(conn *c, const gpupool_arbiter_msg *m); /* -1: not a control request */
/* a client's request (its HELLO with its beat page, or a lease request); -1: end it */
int on_client(conn *c, const gpupool_arbiter_msg *m, int beat_fd);

/* lease.c */
void lease_acquire(conn *c, uint64_t now);
void lease_release(conn *c, uint64_t lease, uint64_t now);
void lease_rest(conn *c, uint64_t now);
void lease_gone(conn *c, uint64_t now); /* the client's connection closed */
/* look at every GPU: hand free leases out, ask for or take back held ones; the time until the
 * next look is due (ns; 0: only when something happens) */
uint64_t lease_schedule(uint64_t now);
/* the earliest clock of the shares that want `g` now, other than `self` (UINT64_MAX: none) */
uint64_t lease_floor(const gpu *g, int self, uint64_t now);

#endif /* GPUPOOL_ARBITERD_H */
