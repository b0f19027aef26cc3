/*
 * The arbiter's registry: the GPUs' views (files it alone writes), the shares the daemon
 * registers on the control socket, and the shares' processes that say which share they are on
 * the lease socket (their key, their user by SO_PEERCRED, their beat page).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arbiterd.h"

/* ---- the GPUs' views ------------------------------------------------------------------------ */

gpu *find_gpu(const uint8_t uuid[16], int create) {
    for (int i = 0; i < gpu_count; i++)
        if (memcmp(gpus[i].uuid, uuid, 16) == 0) return &gpus[i];
    if (!create || gpu_count >= ARB_MAX_GPUS) return NULL;
    char name[64];
    int n = snprintf(name, sizeof name, "%s", GPUPOOL_ARBITER_VIEW_PREFIX);
    for (int i = 0; i < 16; i++) n += snprintf(name + n, sizeof name - (size_t)n, "%02x", uuid[i]);
    /* a fresh file each time: a process that still maps an older one reads that one, unharmed */
    unlinkat(dir_fd, name, 0);
    int fd = openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || fchmod(fd, 0644) != 0 || ftruncate(fd, sizeof(gpupool_arbiter_view)) != 0) {
        say("cannot create the view %s: %s", name, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    void *mem = mmap(NULL, sizeof(gpupool_arbiter_view), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) return NULL;
    gpu *g = &gpus[gpu_count++];
    memset(g, 0, sizeof *g);
    memcpy(g->uuid, uuid, 16);
    g->view = mem;
    memcpy(g->view->uuid, uuid, 16);
    g->view->version = GPUPOOL_ARBITER_VERSION;
    g->view->size = sizeof(gpupool_arbiter_view);
    __atomic_store_n(&g->view->magic, GPUPOOL_ARBITER_MAGIC, __ATOMIC_RELEASE);
    return g;
}

static int find_slot(const gpu *g, uint64_t share_id) {
    for (int i = 0; i < GPUPOOL_ARBITER_SHARES; i++)
        if (g->view->share[i].share_id == share_id) return i;
    return -1;
}

void free_slot(gpu *g, int slot) {
    memset(&g->view->share[slot], 0, sizeof g->view->share[slot]);
    g->priv[slot] = (slot_private){0};
}

/* ---- control: the daemon's registrations ----------------------------------------------------- */

static int do_register(conn *c, const gpupool_arbiter_msg *m) {
    uint32_t weight = (uint32_t)(m->value & 0xff), priority = (uint32_t)(m->value >> 8 & 0xff);
    uint32_t policy = (uint32_t)(m->value >> 16 & 0xff), slice_us = (uint32_t)(m->value >> 32);
    /* bits 24..31 are no term of this version: refused, not ignored */
    if (m->share_id == 0 || weight < 1 || weight > 100 || priority > 2 || policy > 1 ||
        (m->value >> 24 & 0xff) != 0 ||
        (slice_us != 0 &&
         (slice_us < GPUPOOL_ARB_SLICE_MIN_US || slice_us > GPUPOOL_ARB_SLICE_MAX_US)))
        return -(int)GPUPOOL_ARB_WHY_INVALID;
    gpu *g = find_gpu(m->uuid, 1);
    if (g == NULL) return -(int)GPUPOOL_ARB_WHY_FULL;
    uint64_t now = now_ns();
    int slot = find_slot(g, m->share_id);
    if (slot >= 0 && g->priv[slot].key != m->key) return -(int)GPUPOOL_ARB_WHY_USER;
    if (slot < 0) {
        slot = find_slot(g, 0);
        if (slot < 0) return -(int)GPUPOOL_ARB_WHY_FULL;
        uint64_t low = lease_floor(g, slot, now);
        g->view->share[slot] =
            (gpupool_arbiter_share){.share_id = m->share_id, .vtime = low == UINT64_MAX ? 0 : low};
        g->priv[slot].key = m->key;
    }
    gpupool_arbiter_share *s = &g->view->share[slot];
    s->weight = weight;
    s->priority = priority;
    s->policy = policy;
    s->uid = m->arg;
    g->priv[slot].owner = c;
    s->slice_us = slice_us;
    return 1;
}

/* every GPU's slot of the share: its weight changed, or the registration dropped */
static int each_slot(conn *c, const gpupool_arbiter_msg *m) {
    int found = 0;
    for (int i = 0; i < gpu_count; i++) {
        gpu *g = &gpus[i];
        int slot = find_slot(g, m->share_id);
        if (slot < 0 || m->share_id == 0) continue;
        found++;
        if (m->kind == GPUPOOL_ARB_WEIGHT) {
            if (m->value < 1 || m->value > 100) return -(int)GPUPOOL_ARB_WHY_INVALID;
            g->view->share[slot].weight = (uint32_t)m->value;
        } else if (g->view->share[slot].clients == 0) {
            free_slot(g, slot);
        } else {
            g->priv[slot].owner = NULL; /* it goes with its last process */
        }
    }
    (void)c;
    return found > 0 ? found : -(int)GPUPOOL_ARB_WHY_UNKNOWN;
}

int on_control(conn *c, const gpupool_arbiter_msg *m) {
    int rc;
    if (m->kind == GPUPOOL_ARB_REGISTER) {
        rc = do_register(c, m);
    } else if (m->kind == GPUPOOL_ARB_UNREGISTER || m->kind == GPUPOOL_ARB_WEIGHT) {
        rc = each_slot(c, m);
    } else {
        return -1;
    }
    if (rc < 0) return answer(c, GPUPOOL_ARB_REFUSED, (uint32_t)-rc, 0) == 0 ? 0 : -1;
    return answer(c, GPUPOOL_ARB_OK, (uint32_t)rc, 0);
}

/* ---- clients: the shares' processes --------------------------------------------------------- */

static const char *why_text(uint32_t why) {
    switch (why) {
    case GPUPOOL_ARB_WHY_UNKNOWN: return "no such share on that GPU";
    case GPUPOOL_ARB_WHY_USER: return "the share is another user's";
    case GPUPOOL_ARB_WHY_FULL: return "no slot left on that GPU";
    default: return "a malformed request";
    }
}

static uint32_t hello(conn *c, const gpupool_arbiter_msg *m, int beat_fd) {
    gpu *g = find_gpu(m->uuid, 0);
    int slot = g != NULL && m->share_id != 0 ? find_slot(g, m->share_id) : -1;
    if (slot < 0 || g->priv[slot].key != m->key) return GPUPOOL_ARB_WHY_UNKNOWN;
    gpupool_arbiter_share *s = &g->view->share[slot];
    if (s->uid != GPUPOOL_ARBITER_ANY_UID && s->uid != (uint32_t)c->uid)
        return GPUPOOL_ARB_WHY_USER;
    int seals = beat_fd >= 0 ? fcntl(beat_fd, F_GET_SEALS) : -1;
    struct stat st;
    /* sealed against shrinking: a client cannot make our reads of its page fault */
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(beat_fd, &st) != 0 ||
        st.st_size < (off_t)sizeof(gpupool_arbiter_beat))
        return GPUPOOL_ARB_WHY_INVALID;
    int entry = -1;
    for (int i = 0; i < GPUPOOL_ARBITER_CLIENTS && entry < 0; i++)
        if (g->clients[i] == NULL) entry = i;
    if (entry < 0) return GPUPOOL_ARB_WHY_FULL;
    void *mem = mmap(NULL, sizeof(gpupool_arbiter_beat), PROT_READ, MAP_SHARED, beat_fd, 0);
    if (mem == MAP_FAILED) return GPUPOOL_ARB_WHY_INVALID;
    c->beat = mem;
    c->gpu = g;
    c->slot = slot;
    c->client = entry;
    g->clients[entry] = c;
    g->view->client[entry] =
        (gpupool_arbiter_client){.pid = c->pid, .slot = (uint32_t)slot, .start = c->start};
    s->clients++;
    s->pid = c->pid;
    return 0;
}

int on_client(conn *c, const gpupool_arbiter_msg *m, int beat_fd) {
    uint64_t now = now_ns();
    if (c->gpu == NULL) {
        if (m->kind != GPUPOOL_ARB_HELLO) return -1;
        uint32_t why = hello(c, m, beat_fd);
        if (why != 0) {
            say("pid %d (uid %u) refused for share %016llx: %s", (int)c->pid, (unsigned)c->uid,
                (unsigned long long)m->share_id, why_text(why));
            answer(c, GPUPOOL_ARB_REFUSED, why, 0);
            return -1;
        }
        return answer(c, GPUPOOL_ARB_OK, (uint32_t)c->slot, 0);
    }
    switch (m->kind) {
    case GPUPOOL_ARB_ACQUIRE: lease_acquire(c, now); return 0;
    case GPUPOOL_ARB_RELEASE: lease_release(c, m->value, now); return 0;
    case GPUPOOL_ARB_REST: lease_rest(c, now); return 0;
    default: return -1;
    }
}
