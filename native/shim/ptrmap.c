/*
 * Live allocations of this process: (pointer or handle, kind) -> (device, bytes), so that a free
 * credits exactly what its allocation charged. An open-addressing table with linear probing and
 * backward-shift deletion (no tombstones, so lookups stay short however many frees happen), kept
 * at most half full, behind one mutex.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* 24 bytes, packed so that a large table stays as cache-friendly as it can */
typedef struct {
    uint64_t key; /* 0 = empty: no allocation has pointer or handle 0 */
    uint64_t ctx; /* the context that owns it (freed with it), 0 for none */
    uint64_t size : 56;
    uint64_t dev : 5;
    uint64_t kind : 3;
} gp_entry;

static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_entry *table;
static size_t capacity; /* a power of two */
static size_t count;

static size_t slot_of(uint64_t key, uint32_t kind) {
    uint64_t x = key ^ ((uint64_t)kind << 56);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (size_t)x & (capacity - 1);
}

static void insert(gp_entry entry) {
    size_t i = slot_of(entry.key, entry.kind);
    while (table[i].key != 0 && !(table[i].key == entry.key && table[i].kind == entry.kind))
        i = (i + 1) & (capacity - 1);
    if (table[i].key == 0) count++;
    table[i] = entry;
}

static int grow(void) {
    size_t old_capacity = capacity;
    gp_entry *old = table;
    size_t new_capacity = capacity ? capacity * 2 : 1024;
    gp_entry *fresh = calloc(new_capacity, sizeof *fresh);
    if (fresh == NULL) return -1;
    table = fresh;
    capacity = new_capacity;
    count = 0;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].key != 0) insert(old[i]);
    }
    free(old);
    return 0;
}

void gp_ptrmap_put(uint64_t key, gp_alloc_kind kind, int dev, uint64_t size, uint64_t ctx) {
    pthread_mutex_lock(&map_lock);
    if ((count + 1) * 2 > capacity && grow() != 0) {
        /* out of host memory: this allocation's free will not be credited; say so */
        pthread_mutex_unlock(&map_lock);
        gp_log(GP_LOG_WARN, "out of host memory tracking an allocation; its free goes uncounted");
        return;
    }
    insert((gp_entry){.key = key, .ctx = ctx, .size = size, .dev = (uint64_t)dev, .kind = kind});
    pthread_mutex_unlock(&map_lock);
}

int gp_ptrmap_take(uint64_t key, gp_alloc_kind kind, int *dev, uint64_t *size, uint64_t *ctx) {
    int found = -1;
    pthread_mutex_lock(&map_lock);
    if (capacity == 0) goto out;
    size_t i = slot_of(key, (uint32_t)kind);
    while (table[i].key != 0 && !(table[i].key == key && table[i].kind == (uint32_t)kind))
        i = (i + 1) & (capacity - 1);
    if (table[i].key == 0) goto out;
    *dev = (int)table[i].dev;
    *size = table[i].size;
    *ctx = table[i].ctx;
    found = 0;
    count--;
    /* backward-shift: pull later entries of the probe run into the hole when allowed */
    size_t hole = i;
    for (size_t j = (i + 1) & (capacity - 1); table[j].key != 0; j = (j + 1) & (capacity - 1)) {
        size_t home = slot_of(table[j].key, table[j].kind);
        /* entry j may move to the hole if its home is not in (hole, j] cyclically */
        int between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (between) continue;
        table[hole] = table[j];
        hole = j;
    }
    memset(&table[hole], 0, sizeof table[hole]);
out:
    pthread_mutex_unlock(&map_lock);
    return found;
}

void gp_ptrmap_drop_context(uint64_t ctx, void (*release)(int dev, uint64_t bytes)) {
    pthread_mutex_lock(&map_lock);
    if (capacity == 0) goto out;
    /* rebuild without the context's entries: simpler than deleting while probing, and a context
     * is destroyed rarely */
    gp_entry *old = table;
    gp_entry *fresh = calloc(capacity, sizeof *fresh);
    if (fresh == NULL) goto out; /* no memory: its bytes stay counted until the process ends */
    table = fresh;
    count = 0;
    for (size_t i = 0; i < capacity; i++) {
        if (old[i].key == 0) continue;
        if (old[i].ctx == ctx) {
            release((int)old[i].dev, old[i].size);
        } else {
            insert(old[i]);
        }
    }
    free(old);
out:
    pthread_mutex_unlock(&map_lock);
}

gp_ptrmap_item *gp_ptrmap_snapshot(size_t *n_out) {
    gp_ptrmap_item *items = NULL;
    size_t n = 0;
    pthread_mutex_lock(&map_lock);
    if (count > 0) items = malloc(count * sizeof *items);
    for (size_t i = 0; items != NULL && i < capacity; i++) {
        if (table[i].key == 0) continue;
        items[n++] = (gp_ptrmap_item){.key = table[i].key,
                                      .ctx = table[i].ctx,
                                      .size = table[i].size,
                                      .dev = (int)table[i].dev,
                                      .kind = (gp_alloc_kind)table[i].kind};
    }
    pthread_mutex_unlock(&map_lock);
    *n_out = n;
    return items;
}

/* in a forked child: the parent's allocations are not the child's to free */
void gp_ptrmap_reset(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    map_lock = fresh;
    if (table != NULL) memset(table, 0, capacity * sizeof *table);
    count = 0;
}
