/*
 * Who holds each GPU's lease: the arbiter's whole policy, run by its one thread.
 *
 * A process launches only while it holds its GPU's lease. A free lease goes to the waiting
 * process whose share goes first: a `high` or unprioritised share before a `low` one, then the
 * earliest virtual clock. A share is charged the lease time it was granted (from the grant to the
 * release), never what it reports: its clock advances by that time x 100 / its weight, so busy
 * shares split the GPU by weight. A share that has not wanted the GPU for GP_IDLE_NS starts again
 * at the earliest clock of the others: idle time is never banked.
 *
 * The holder is asked to give the lease back (the view's yield_lease, read at its next batch)
 * when its lease is a slice old and a waiting share of its class is now first; it drains its
 * work and releases; a `low` holder is asked at once when a share of another class waits. The
 * slice is the shorter of the holder's and the waiter's: each share's registration sets its own
 * (a latency-bound service's few milliseconds), GP_LEASE_NS (the batch window) if it set none,
 * so a latency-bound share whose clock comes first waits for an equal-priority holder at most
 * its own slice and the holder's work in flight. A `high` share that asks takes the lease from a
 * `low` holder at once (the low one finds it gone at its next batch: next to an active high share
 * its batches are small). A holder that has gone quiet (its beat shows no launch for
 * GP_HOLD_IDLE_NS, GP_QUICK_IDLE_NS for a holder with a slice shorter than the batch window or a
 * high holder when only low shares wait, and no queued work) loses the lease at once when another
 * waits; one that does not give it back within GP_YIELD_LIMIT_NS of being asked loses it whatever
 * its beat says.
 */
#include <stddef.h>
#include <stdint.h>

#include "arbiterd.h"

#define GP_LEASE_NS (20 * ARB_NS_PER_MS)
#define GP_HOLD_IDLE_NS (3 * ARB_NS_PER_MS)
#define GP_QUICK_IDLE_NS (500 * 1000ULL)
#define GP_IDLE_NS (50 * ARB_NS_PER_MS)
#define GP_YIELD_LIMIT_NS (1000 * ARB_NS_PER_MS)
#define GP_MIN_WAKE_NS (20 * 1000ULL) /* the soonest the arbiter looks again */
/* and the latest, while a process waits: a hand-over measured slower (the median request of a
 * high share beside a low one +0.1 ms on a busy machine) when the arbiter slept until the exact
 * deadline its holder's beat gave */
#define GP_POLL_NS (200 * 1000ULL)

static uint64_t lease_counter;

static int is_low(const gpupool_arbiter_share *s) { return s->priority == 2; }

/* the lease length a share registered (the batch window if none) */
static uint64_t slice_of(const gpu *g, int slot) {
    uint64_t slice = g->view->share[slot % GPUPOOL_ARBITER_SHARES].slice_us * 1000ULL;
    return slice != 0 ? slice : GP_LEASE_NS;
}

uint64_t lease_floor(const gpu *g, int self, uint64_t now) {
    uint64_t low = UINT64_MAX;
    for (int i = 0; i < GPUPOOL_ARBITER_SHARES; i++) {
        const gpupool_arbiter_share *s = &g->view->share[i];
        if (i == self || s->share_id == 0 || s->wanted_ns + GP_IDLE_NS < now) continue;
        if (s->vtime < low) low = s->vtime;
    }
    return low;
}

static void end_lease(gpu *g, uint64_t now) {
    gpupool_arbiter_view *v = g->view;
    gpupool_arbiter_share *s = &v->share[v->holder_slot % GPUPOOL_ARBITER_SHARES];
    uint64_t held = now > v->granted_ns ? now - v->granted_ns : 0;
    if (s->share_id != 0 && s->weight != 0) {
        s->vtime += held * 100 / s->weight;
        s->busy_ns += held;
    }
    g->holder = NULL;
    __atomic_store_n(&v->lease, 0, __ATOMIC_RELEASE);
    v->yield_lease = 0;
    v->holder_pid = 0;
}

static void grant(gpu *g, conn *c, uint64_t now) {
    gpupool_arbiter_view *v = g->view;
    if (lease_counter == 0) lease_counter = now; /* a restarted arbiter never reuses an id */
    uint64_t lease = ++lease_counter;
    g->holder = c;
    g->yield_at = 0;
    v->holder_pid = c->pid;
    v->holder_slot = (uint32_t)c->slot;
    v->granted_ns = now;
    v->yield_lease = 0;
    __atomic_store_n(&v->lease, lease, __ATOMIC_RELEASE);
    c->waiting = 0;
    v->share[c->slot].waiting--;
    if (answer(c, GPUPOOL_ARB_GRANT, 0, lease) != 0) end_lease(g, now);
}

void lease_acquire(conn *c, uint64_t now) {
    gpu *g = c->gpu;
    gpupool_arbiter_share *s = &g->view->share[c->slot];
    if (s->wanted_ns + GP_IDLE_NS < now) {
        uint64_t low = lease_floor(g, c->slot, now);
        if (low != UINT64_MAX && low > s->vtime) s->vtime = low;
    }
    s->wanted_ns = now;
    s->pid = c->pid;
    s->resting = 0;
    if (g->holder == c) {
        /* it holds it already (it asked again after a fork or a lost answer): say so */
        answer(c, GPUPOOL_ARB_GRANT, 0, g->view->lease);
        return;
    }
    if (!c->waiting) {
        c->waiting = 1;
        s->waiting++;
    }
}

void lease_release(conn *c, uint64_t lease, uint64_t now) {
    gpu *g = c->gpu;
    if (g->holder != c || g->view->lease != lease) {
        if (!c->warned++)
            say("pid %d gave back lease %llu of GPU share %016llx, which it does not hold: "
                "ignored",
                (int)c->pid, (unsigned long long)lease,
                (unsigned long long)g->view->share[c->slot].share_id);
        return;
    }
    end_lease(g, now);
}

void lease_rest(conn *c, uint64_t now) {
    (void)now;
    c->gpu->view->share[c->slot].resting = 1;
}

void lease_gone(conn *c, uint64_t now) {
    gpu *g = c->gpu;
    if (g == NULL) return;
    if (g->holder == c) end_lease(g, now);
    if (c->waiting) g->view->share[c->slot].waiting--;
    c->waiting = 0;
}

/* the waiting process that goes first, or NULL */
static conn *first_waiting(gpu *g) {
    conn *best = NULL;
    const gpupool_arbiter_share *bs = NULL;
    for (int i = 0; i < GPUPOOL_ARBITER_CLIENTS; i++) {
        conn *c = g->clients[i];
        if (c == NULL || !c->waiting) continue;
        const gpupool_arbiter_share *s = &g->view->share[c->slot];
        if (best == NULL || is_low(s) < is_low(bs) ||
            (is_low(s) == is_low(bs) && s->vtime < bs->vtime)) {
            best = c;
            bs = s;
        }
    }
    return best;
}

/* when the holder counts as quiet, as its beat says now: its launches within a batch are
 * counted, not timed, so a count that moved since the last look is a launch seen now (the
 * arbiter looks at least every GP_POLL_NS while another share waits) */
static uint64_t quiet_at(const gpu *g, uint64_t now, uint64_t hold_idle) {
    conn *h = g->holder;
    const gpupool_arbiter_beat *b = h->beat;
    uint64_t last = __atomic_load_n(&b->last_launch_ns, __ATOMIC_RELAXED);
    uint64_t until = __atomic_load_n(&b->busy_until_ns, __ATOMIC_RELAXED);
    uint64_t launches = __atomic_load_n(&b->launches, __ATOMIC_RELAXED);
    if (launches != h->seen_launches) {
        h->seen_launches = launches;
        h->seen_ns = now;
    }
    if (h->seen_ns > last) last = h->seen_ns;
    uint64_t since = last > g->view->granted_ns ? last : g->view->granted_ns;
    uint64_t idle = since + hold_idle < since ? UINT64_MAX : since + hold_idle;
    return (idle > until ? idle : until) + 1;
}

static uint64_t earliest(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* one GPU; when it must be looked at again (0: only when something happens) */
static uint64_t schedule_gpu(gpu *g, uint64_t now) {
    conn *next = first_waiting(g);
    if (next == NULL) return 0;
    gpupool_arbiter_view *v = g->view;
    if (g->holder != NULL) {
        const gpupool_arbiter_share *h = &v->share[v->holder_slot % GPUPOOL_ARBITER_SHARES];
        const gpupool_arbiter_share *n = &v->share[next->slot];
        /* a high share takes the GPU from a low holder at once: the low one finds its lease gone
         * at its next batch, and what it has in flight then is one small batch */
        int preempt = is_low(h) && n->priority == 1;
        /* a holder past its lease gives way to a waiting share of its class that is now first
         * (the holder's clock counted with the lease it holds); a low holder to any other class
         * at once, after its own work (the other's events then measure only its own time) */
        uint64_t held = now > v->granted_ns ? now - v->granted_ns : 0;
        uint64_t clock = h->vtime + (h->weight ? held * 100 / h->weight : 0);
        uint64_t own = slice_of(g, (int)v->holder_slot), theirs = slice_of(g, next->slot);
        uint64_t slice = own < theirs ? own : theirs;
        int ask = (is_low(h) && !is_low(n)) ||
                  (held >= slice && is_low(n) == is_low(h) && n->vtime < clock);
        if (ask && v->yield_lease != v->lease) {
            v->yield_lease = v->lease;
            g->yield_at = now;
        }
        /* a latency-bound holder's gaps between requests go to the others at once, as a high
         * holder's do to low shares; a batch job keeps the lease over its host gaps */
        uint64_t hold_idle =
            own < GP_LEASE_NS || (!is_low(h) && is_low(n)) ? GP_QUICK_IDLE_NS : GP_HOLD_IDLE_NS;
        int overdue = g->yield_at != 0 && now > g->yield_at + GP_YIELD_LIMIT_NS;
        if (overdue && !g->holder->warned++)
            say("pid %d kept the lease of GPU share %016llx past %llu ms after it was asked "
                "back: taken",
                (int)g->holder->pid, (unsigned long long)h->share_id,
                (unsigned long long)(GP_YIELD_LIMIT_NS / ARB_NS_PER_MS));
        uint64_t quiet = quiet_at(g, now, hold_idle);
        if (!preempt && !overdue && now < quiet) {
            uint64_t wake = quiet;
            if (g->yield_at != 0) {
                wake = earliest(wake, g->yield_at + GP_YIELD_LIMIT_NS + 1);
            } else if (is_low(n) == is_low(h)) {
                /* when the holder's clock passes the waiter's, its lease at least a slice */
                uint64_t need = n->vtime > h->vtime && h->weight
                                    ? (n->vtime - h->vtime) * h->weight / 100 + 1
                                    : 0;
                wake = earliest(wake, v->granted_ns + (need > slice ? need : slice));
            }
            return wake;
        }
        end_lease(g, now);
    }
    grant(g, next, now);
    return first_waiting(g) != NULL ? now + GP_MIN_WAKE_NS : 0;
}

uint64_t lease_schedule(uint64_t now) {
    uint64_t wake = UINT64_MAX;
    for (int i = 0; i < gpu_count; i++) {
        uint64_t at = schedule_gpu(&gpus[i], now);
        if (at != 0) wake = earliest(wake, at);
    }
    if (wake == UINT64_MAX) return 0;
    uint64_t in = wake > now + GP_MIN_WAKE_NS ? wake - now : GP_MIN_WAKE_NS;
    return in < GP_POLL_NS ? in : GP_POLL_NS;
}
