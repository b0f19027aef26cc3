/*
 * The node-wide activity file of the `share` policy: per (GPU UUID, share) the last time that
 * share launched work there. A share under `share` runs unthrottled while no other share has been
 * active on its GPU within GP_CONTENTION_NS, and falls back to its percentage when one has.
 * Timestamps are CLOCK_MONOTONIC, the same for every process of the node. Where the file cannot be
 * used, every GPU counts as contended, so a share never exceeds its percentage by mistake.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

#define GP_ACTIVITY_MAGIC 0x3154434150505047ULL /* "GPPACT1" read as little-endian u64 */
#define GP_ACTIVITY_ENTRIES 256
#define GP_PUBLISH_EVERY_NS (2 * GP_NS_PER_MS)
#define GP_CONTENTION_NS (50 * GP_NS_PER_MS)
#define GP_STALE_NS (10 * GP_NS_PER_S) /* an entry this old may be taken by another share */

typedef struct {
    char uuid[16];
    uint64_t share_id; /* 0 = free */
    uint64_t last_active_ns;
    uint64_t pad;
} gp_activity_entry;

typedef struct {
    uint64_t magic;
    uint32_t entries;
    uint32_t pad;
    union {
        pthread_mutex_t mutex;
        char pad[128];
    } lock;
    gp_activity_entry entry[GP_ACTIVITY_ENTRIES];
} gp_activity_file;

typedef struct {
    int state; /* 0 unknown, 1 ready, -1 unusable */
    char uuid[16];
    int entry;
    uint64_t published_ns;
    uint64_t checked_ns; /* the last scan for other shares, and what it found */
    int contended;
} gp_activity_dev;

static pthread_mutex_t local_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_activity_file *file; /* NULL until opened; (void *)-1 when it cannot be */
static gp_activity_dev devs[GP_MAX_DEVICES];

static gp_activity_file *map_file(void) {
    const char *path = gp_region_activity_path();
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        gp_log(GP_LOG_WARN, "cannot open the activity file %s (%s): the share policy acts as cap",
               path, strerror(errno));
        return NULL;
    }
    gp_activity_file *map = NULL;
    struct stat st;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) goto out;
    if (st.st_size == 0 && ftruncate(fd, sizeof(gp_activity_file)) != 0) goto out;
    if (st.st_size != 0 && st.st_size != (off_t)sizeof(gp_activity_file)) goto out;
    void *mem = mmap(NULL, sizeof(gp_activity_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) goto out;
    map = mem;
    if (__atomic_load_n(&map->magic, __ATOMIC_ACQUIRE) == 0) {
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&map->lock.mutex, &attr);
        pthread_mutexattr_destroy(&attr);
        map->entries = GP_ACTIVITY_ENTRIES;
        __atomic_store_n(&map->magic, GP_ACTIVITY_MAGIC, __ATOMIC_RELEASE);
    } else if (map->magic != GP_ACTIVITY_MAGIC || map->entries != GP_ACTIVITY_ENTRIES) {
        munmap(mem, sizeof(gp_activity_file));
        map = NULL;
    }
out:
    if (map == NULL)
        gp_log(GP_LOG_WARN, "%s is not a usable activity file: the share policy acts as cap", path);
    flock(fd, LOCK_UN);
    close(fd);
    return map;
}

/* this share's entry for `uuid`, claimed if needed; -1 if the table is full */
static int claim_entry(const char *uuid, uint64_t now) {
    uint64_t share = gp_region_share_id();
    if (pthread_mutex_lock(&file->lock.mutex) == EOWNERDEAD)
        pthread_mutex_consistent(&file->lock.mutex); /* entries are written whole: still valid */
    int found = -1, spare = -1;
    for (int i = 0; i < GP_ACTIVITY_ENTRIES; i++) {
        gp_activity_entry *e = &file->entry[i];
        if (e->share_id == share && memcmp(e->uuid, uuid, 16) == 0) {
            found = i;
            break;
        }
        uint64_t last = __atomic_load_n(&e->last_active_ns, __ATOMIC_RELAXED);
        if (spare < 0 && (e->share_id == 0 || last + GP_STALE_NS < now)) spare = i;
    }
    if (found < 0 && spare >= 0) {
        gp_activity_entry *e = &file->entry[spare];
        memcpy(e->uuid, uuid, 16);
        e->share_id = share;
        __atomic_store_n(&e->last_active_ns, now, __ATOMIC_RELAXED);
        found = spare;
    }
    pthread_mutex_unlock(&file->lock.mutex);
    return found;
}

static gp_activity_dev *ready_dev(int dev, uint64_t now) {
    gp_activity_dev *d = &devs[dev];
    int state = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (state != 0) return state > 0 ? d : NULL;
    pthread_mutex_lock(&local_lock);
    if (d->state == 0) {
        if (file == NULL) {
            file = map_file();
            if (file == NULL) file = (gp_activity_file *)-1;
        }
        __typeof__(&cuDeviceGetUuid) get_uuid = GP_REAL(cuDeviceGetUuid);
        CUuuid uuid;
        int ok = file != (gp_activity_file *)-1 && get_uuid != NULL &&
                 get_uuid(&uuid, dev) == CUDA_SUCCESS;
        if (ok) {
            memcpy(d->uuid, uuid.bytes, 16);
            d->entry = claim_entry(d->uuid, now);
            ok = d->entry >= 0;
        }
        __atomic_store_n(&d->state, ok ? 1 : -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&local_lock);
    return d->state > 0 ? d : NULL;
}

void gp_activity_touch(int dev, uint64_t now) {
    if (dev < 0 || dev >= GP_MAX_DEVICES) return;
    gp_activity_dev *d = &devs[dev];
    if (d->state != 0 && now - __atomic_load_n(&d->published_ns, __ATOMIC_RELAXED) <
                             GP_PUBLISH_EVERY_NS)
        return;
    d = ready_dev(dev, now);
    if (d == NULL) return;
    __atomic_store_n(&d->published_ns, now, __ATOMIC_RELAXED);
    gp_activity_entry *e = &file->entry[d->entry];
    if (e->share_id != gp_region_share_id()) {
        /* taken over after we were idle past GP_STALE_NS: claim again */
        d->entry = claim_entry(d->uuid, now);
        if (d->entry < 0) {
            __atomic_store_n(&d->state, -1, __ATOMIC_RELEASE);
            return;
        }
        e = &file->entry[d->entry];
    }
    __atomic_store_n(&e->last_active_ns, now, __ATOMIC_RELAXED);
}

static int scan(const gp_activity_dev *d, uint64_t now);

int gp_activity_contended(int dev, uint64_t now) {
    if (dev < 0 || dev >= GP_MAX_DEVICES) return 1;
    gp_activity_dev *d = ready_dev(dev, now);
    if (d == NULL) return 1;
    if (now - __atomic_load_n(&d->checked_ns, __ATOMIC_RELAXED) < GP_PUBLISH_EVERY_NS)
        return __atomic_load_n(&d->contended, __ATOMIC_RELAXED);
    int found = scan(d, now);
    __atomic_store_n(&d->contended, found, __ATOMIC_RELAXED);
    __atomic_store_n(&d->checked_ns, now, __ATOMIC_RELAXED);
    return found;
}

static int scan(const gp_activity_dev *d, uint64_t now) {
    uint64_t share = gp_region_share_id();
    for (int i = 0; i < GP_ACTIVITY_ENTRIES; i++) {
        gp_activity_entry *e = &file->entry[i];
        uint64_t owner = __atomic_load_n(&e->share_id, __ATOMIC_RELAXED);
        if (owner == 0 || owner == share || memcmp(e->uuid, d->uuid, 16) != 0) continue;
        if (__atomic_load_n(&e->last_active_ns, __ATOMIC_RELAXED) + GP_CONTENTION_NS > now)
            return 1;
    }
    return 0;
}

/* a forked child may have been forked while another thread held the local lock */
void gp_activity_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    local_lock = fresh;
}
