/*
 * The simulated node: mapping state.bin, the driver lock shared by all processes, process slots,
 * device visibility and each GPU's kernel timeline.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpupool_pidstat.h"
#include "sim.h"

sim_globals g_sim = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* driver_lock area of the header: an init word, then a robust process-shared mutex */
enum { LOCK_UNINIT = 0, LOCK_INITIALISING = 1, LOCK_READY = 2 };
typedef struct {
    _Atomic uint32_t state;
    uint32_t pad;
    pthread_mutex_t mutex;
} sim_driver_lock_area;

_Static_assert(sizeof(sim_driver_lock_area) <= 128, "driver lock must fit driver_lock[128]");
_Static_assert(sizeof(gpupool_sim_header) <= GPUPOOL_SIM_HEADER_SIZE, "header size");
_Static_assert(sizeof(gpupool_sim_gpu) == GPUPOOL_SIM_GPU_RECORD_SIZE, "gpu record size");
_Static_assert(sizeof(gpupool_sim_proc) == GPUPOOL_SIM_PROC_RECORD_SIZE, "proc record size");

void sim_complain(const char *fmt, const char *arg) {
    /* the interception library's prefix, so that one pattern finds every line gpupool's libraries
     * write, and one write(2), so that concurrent processes' lines never interleave */
    char line[1024];
    int n = snprintf(line, sizeof line, "gpupool[%d]: simulated driver: ", (int)getpid());
    int m = snprintf(line + n, sizeof line - (size_t)n - 1, fmt, arg);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t rc = write(STDERR_FILENO, line, len);
    (void)rc;
}

uint64_t sim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t deadline_ns) {
    /* a real GPU's synchronize returns within microseconds of the work's end; Linux's default
     * timer slack (50 us) would add a wake-up delay after every simulated kernel the caller
     * waits for */
    static __thread int precise;
    if (!precise) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        precise = 1;
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

gpupool_sim_header *sim_header(void) { return (gpupool_sim_header *)g_sim.map; }

gpupool_sim_gpu *sim_gpu(int phys) {
    if (phys >= (int)GPUPOOL_SIM_MAX_GPUS) /* a MIG instance's record */
        return (gpupool_sim_gpu *)(g_sim.map + GPUPOOL_SIM_MIG_OFFSET +
                                   (size_t)(phys - (int)GPUPOOL_SIM_MAX_GPUS) *
                                       GPUPOOL_SIM_GPU_RECORD_SIZE);
    return (gpupool_sim_gpu *)(g_sim.map + GPUPOOL_SIM_GPUS_OFFSET +
                               (size_t)phys * GPUPOOL_SIM_GPU_RECORD_SIZE);
}

/* the GPU a device number is on: itself, or a MIG instance's parent */
static int sim_parent_of(int phys) {
    return phys < (int)GPUPOOL_SIM_MAX_GPUS ? phys : (int)sim_gpu(phys)->mig_parent - 1;
}

/* a device number that names a GPU of the node or one of its live MIG instances */
static int sim_device_exists(int phys) {
    if (phys < 0 || phys >= (int)GPUPOOL_SIM_MAX_DEVICES) return 0;
    if (phys < (int)GPUPOOL_SIM_MAX_GPUS) return (uint32_t)phys < sim_header()->gpu_count;
    return sim_gpu(phys)->mig_parent != 0;
}

gpupool_sim_proc *sim_proc(int slot) {
    return (gpupool_sim_proc *)(g_sim.map + GPUPOOL_SIM_PROCS_OFFSET +
                                (size_t)slot * GPUPOOL_SIM_PROC_RECORD_SIZE);
}

int sim_gpu_lost(int phys) {
    /* an instance falls off the bus with its GPU; a destroyed instance is gone as well */
    if (!sim_device_exists(phys)) return 1;
    int gpu = sim_parent_of(phys);
    return (__atomic_load_n(&sim_gpu(gpu)->flags, __ATOMIC_RELAXED) & GPUPOOL_SIM_GPU_LOST) != 0;
}

CUresult sim_require_init(void) {
    return g_sim.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* ---- the driver lock ------------------------------------------------------------------- */

static sim_driver_lock_area *sim_lock_area(void) {
    return (sim_driver_lock_area *)sim_header()->driver_lock;
}

static void sim_lock_initialise(sim_driver_lock_area *area) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&area->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    atomic_store_explicit(&area->state, LOCK_READY, memory_order_release);
}

/* The first process to map a fresh file initialises the lock; the others wait for it. A process
 * that died half-way through initialising (the word stays INITIALISING for long) is replaced. */
static void sim_lock_prepare(void) {
    sim_driver_lock_area *area = sim_lock_area();
    uint32_t expected = LOCK_UNINIT;
    if (atomic_compare_exchange_strong(&area->state, &expected, LOCK_INITIALISING)) {
        sim_lock_initialise(area);
        return;
    }
    uint64_t give_up = sim_now_ns() + 2000000000ull;
    while (atomic_load_explicit(&area->state, memory_order_acquire) != LOCK_READY) {
        if (sim_now_ns() > give_up) {
            expected = LOCK_INITIALISING;
            if (atomic_compare_exchange_strong(&area->state, &expected, LOCK_INITIALISING))
                sim_lock_initialise(area);
            return;
        }
        sim_sleep_until(sim_now_ns() + 100000);
    }
}

/* After a process died holding the lock, counters may be half-updated: recompute each GPU's
 * memory in use from the live slots. */
static void sim_repair_locked(void) {
    sim_reclaim_dead_locked();
    uint64_t used[GPUPOOL_SIM_MAX_DEVICES] = {0};
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        gpupool_sim_proc *p = sim_proc((int)s);
        if (p->pid != 0 && p->gpu >= 0 && (uint32_t)p->gpu < GPUPOOL_SIM_MAX_DEVICES)
            used[p->gpu] += p->memory_used;
    }
    for (uint32_t i = 0; i < GPUPOOL_SIM_MAX_DEVICES; i++)
        if (sim_device_exists((int)i)) sim_gpu((int)i)->memory_used = used[i];
}

void sim_driver_lock(void) {
    int rc = pthread_mutex_lock(&sim_lock_area()->mutex);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&sim_lock_area()->mutex);
        sim_repair_locked();
    }
}

void sim_driver_unlock(void) { pthread_mutex_unlock(&sim_lock_area()->mutex); }

/* ---- process slots (driver lock held) ---------------------------------------------------- */

static void sim_free_slot_locked(gpupool_sim_proc *p) {
    if (sim_device_exists(p->gpu)) {
        gpupool_sim_gpu *rec = sim_gpu(p->gpu);
        rec->memory_used =
            rec->memory_used > p->memory_used ? rec->memory_used - p->memory_used : 0;
    }
    memset(p, 0, sizeof *p);
}

/* Gives back the memory of processes that are gone (or whose pid now names another process). */
int sim_reclaim_dead_locked(void) {
    int reclaimed = 0;
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        gpupool_sim_proc *p = sim_proc((int)s);
        if (p->pid == 0 || (p->pid == g_sim.pid && p->start_time == g_sim.start_time))
            continue; /* free, or this process's own */
        if (gpupool_start_time(p->pid) != p->start_time) {
            sim_free_slot_locked(p);
            reclaimed++;
        }
    }
    return reclaimed;
}

gpupool_sim_proc *sim_slot_locked(int phys) {
    int cached = g_sim.slot[phys];
    if (cached >= 0) return sim_proc(cached);
    sim_reclaim_dead_locked();
    int free_slot = -1;
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        gpupool_sim_proc *p = sim_proc((int)s);
        if (p->pid == g_sim.pid && p->gpu == phys && p->start_time == g_sim.start_time) {
            g_sim.slot[phys] = (int)s;
            return p;
        }
        if (p->pid == 0 && free_slot < 0) free_slot = (int)s;
    }
    if (free_slot < 0) {
        static int warned;
        if (!warned++) sim_complain("all %s process slots of the simulated node are taken", "256");
        return NULL;
    }
    gpupool_sim_proc *p = sim_proc(free_slot);
    memset(p, 0, sizeof *p);
    p->gpu = phys;
    p->start_time = g_sim.start_time;
    p->pid = g_sim.pid;
    g_sim.slot[phys] = free_slot;
    return p;
}

static int sim_fits(const gpupool_sim_gpu *rec, uint64_t size) {
    return rec->memory_used <= rec->memory_total && size <= rec->memory_total - rec->memory_used;
}

/* `size` more within `limit` bytes of which `used` are taken (a limit of 0: none) */
static int sim_within(uint64_t limit, uint64_t used, uint64_t size) {
    return limit == 0 || (used <= limit && size <= limit - used);
}

CUresult sim_memory_reserve(int phys, size_t size, uint64_t process_limit) {
    CUresult rc = CUDA_SUCCESS;
    sim_driver_lock();
    gpupool_sim_gpu *rec = sim_gpu(phys);
    gpupool_sim_proc *slot = sim_slot_locked(phys);
    if (slot == NULL || !sim_within(process_limit, slot->memory_used, size)) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (!sim_fits(rec, size) && (sim_reclaim_dead_locked() == 0 || !sim_fits(rec, size))) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        rec->memory_used += size;
        slot->memory_used += size;
    }
    sim_driver_unlock();
    return rc;
}

void sim_memory_release(int phys, size_t size) {
    sim_driver_lock();
    gpupool_sim_gpu *rec = sim_gpu(phys);
    gpupool_sim_proc *slot = sim_slot_locked(phys);
    rec->memory_used = rec->memory_used > size ? rec->memory_used - size : 0;
    if (slot != NULL) slot->memory_used = slot->memory_used > size ? slot->memory_used - size : 0;
    sim_driver_unlock();
}

/* ---- the kernel timeline ------------------------------------------------------------------- */

uint64_t sim_kernel_duration_ns(uint64_t threads) {
    return (uint64_t)((unsigned __int128)threads * g_sim.dur_num / g_sim.dur_den);
}

/* The same grid takes longer on a MIG instance, which has a slice of its GPU's SMs. */
uint64_t sim_on_device_ns(int phys, uint64_t duration_ns) {
    const gpupool_sim_gpu *rec = sim_gpu(phys);
    if (phys < (int)GPUPOOL_SIM_MAX_GPUS || rec->sm_count == 0) return duration_ns;
    uint32_t gpu_sms = sim_gpu(sim_parent_of(phys))->sm_count;
    return (uint64_t)((unsigned __int128)duration_ns * gpu_sms / rec->sm_count);
}

/* The time `bytes` take over the GPU's host link (PCIe or NVLink-C2C), 0 when the state file
 * gives no bandwidth. A MIG instance shares its GPU's link. */
uint64_t sim_link_ns(int phys, uint64_t bytes) {
    uint64_t rate = sim_gpu(sim_parent_of(phys))->link_bytes_s;
    if (rate == 0 || bytes == 0) return 0;
    return (uint64_t)((unsigned __int128)bytes * 1000000000u / rate);
}

/* a copy over the host link: `st` NULL waits for it, else it is queued on the stream */
void sim_link_copy(sim_ctx *ctx, sim_stream *st, uint64_t bytes) {
    uint64_t ns = sim_link_ns(ctx->gpu, bytes);
    if (ns == 0) return;
    uint64_t now = sim_now_ns();
    if (st == NULL) {
        sim_sleep_until(now + ns);
        return;
    }
    /* queued behind the stream's work, done when the stream gets to it (copy engines run beside
     * the kernels, so the GPU's kernel timeline is not held) */
    uint64_t cur = __atomic_load_n(&st->last_end_ns, __ATOMIC_ACQUIRE), next;
    do {
        next = (cur > now ? cur : now) + ns;
    } while (!__atomic_compare_exchange_n(&st->last_end_ns, &cur, next, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
}

/* Charges `busy_ns` of SM time to the GPU and to this process's slot (taken under the lock). */
void sim_charge_locked(int phys, gpupool_sim_proc *slot, uint64_t busy_ns, uint64_t now) {
    sim_gpu(phys)->busy_ns_total += busy_ns;
    if (slot != NULL) {
        slot->busy_ns += busy_ns;
        slot->last_launch_ns = now;
    }
}

/* Queues `duration_ns` of work after the stream's last work and the GPU's last work: one kernel
 * at a time per GPU across all processes, as a time-sliced GPU runs them (MPS clients: mps.c).
 * Returns the work's end time. */
uint64_t sim_timeline_queue(int phys, uint64_t *stream_end, uint64_t duration_ns) {
    sim_driver_lock();
    gpupool_sim_gpu *rec = sim_gpu(phys);
    uint64_t now = sim_now_ns();
    uint64_t start = now;
    if (rec->busy_until_ns > start) start = rec->busy_until_ns;
    uint64_t stream_last = __atomic_load_n(stream_end, __ATOMIC_ACQUIRE);
    if (stream_last > start) start = stream_last;
    uint64_t end = start + sim_on_device_ns(phys, duration_ns);
    rec->busy_until_ns = end;
    __atomic_store_n(stream_end, end, __ATOMIC_RELEASE);
    sim_charge_locked(phys, sim_slot_locked(phys), duration_ns, now);
    sim_driver_unlock();
    return end;
}

/* ---- cuInit's work ------------------------------------------------------------------------- */

static CUresult sim_map_node(void) {
    const char *node = getenv(GP_ENV_SIM_NODE);
    if (node == NULL || node[0] == '\0') {
        sim_complain("%s", "GPUPOOL_SIM_NODE is not set: set it to a simulated node directory "
                           "(`gpupool exec --simulate 1xH100 -- CMD` does it for you)");
        return CUDA_ERROR_NO_DEVICE;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/state.bin", node) >= (int)sizeof path) {
        sim_complain("GPUPOOL_SIM_NODE is too long: %s", node);
        return CUDA_ERROR_NO_DEVICE;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        sim_complain("cannot open %s: is GPUPOOL_SIM_NODE a simulated node directory?", path);
        return CUDA_ERROR_NO_DEVICE;
    }
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size == (off_t)GPUPOOL_SIM_STATE_SIZE)
        map = mmap(NULL, GPUPOOL_SIM_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        sim_complain("%s is not a gpupool simulated node state (wrong size)", path);
        return CUDA_ERROR_NO_DEVICE;
    }
    const gpupool_sim_header *hdr = map;
    if (hdr->magic != GPUPOOL_SIMSTATE_MAGIC || hdr->version != GPUPOOL_SIMSTATE_VERSION ||
        hdr->gpu_count == 0 || hdr->gpu_count > GPUPOOL_SIM_MAX_GPUS) {
        munmap(map, GPUPOOL_SIM_STATE_SIZE);
        sim_complain("%s is not a gpupool simulated node state of this version", path);
        return CUDA_ERROR_NO_DEVICE;
    }
    g_sim.map = map;
    return CUDA_SUCCESS;
}

/* the device whose uuid starts with `prefix` ("GPU-..." or "MIG-..."), -1 if none or several */
static int sim_find_uuid(const char *prefix, size_t len) {
    int found = -1;
    for (uint32_t i = 0; i < GPUPOOL_SIM_MAX_DEVICES; i++) {
        if (!sim_device_exists((int)i)) continue;
        if (strncmp(sim_gpu((int)i)->uuid, prefix, len) == 0) {
            if (found >= 0) return -1; /* ambiguous prefix */
            found = (int)i;
        }
    }
    return found;
}

/* CUDA_VISIBLE_DEVICES as the real driver reads it: indices, GPU-UUID or MIG-UUID (prefixes),
 * comma separated; the list ends at the first entry that is invalid, unknown or repeated. */
static void sim_apply_visible_devices(void) {
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    int total = (int)sim_header()->gpu_count;
    g_sim.count = 0;
    if (env == NULL) {
        for (int i = 0; i < total; i++) g_sim.phys[g_sim.count++] = i;
        return;
    }
    const char *p = env;
    while (*p != '\0' && g_sim.count < (int)GPUPOOL_SIM_MAX_DEVICES) {
        while (*p == ' ') p++;
        size_t len = strcspn(p, ",");
        size_t trimmed = len;
        while (trimmed > 0 && p[trimmed - 1] == ' ') trimmed--;
        int index = -1;
        if (trimmed > 4 && (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0)) {
            index = sim_find_uuid(p, trimmed);
        } else if (trimmed > 0 && strspn(p, "0123456789") == trimmed) {
            long v = strtol(p, NULL, 10);
            index = v < total ? (int)v : -1;
        }
        if (index < 0) break;
        for (int k = 0; k < g_sim.count; k++)
            if (g_sim.phys[k] == index) return;
        g_sim.phys[g_sim.count++] = index;
        p += len;
        if (*p == ',') p++;
    }
}

static CUresult sim_read_kernel_time(void) {
    const char *env = getenv(GP_ENV_SIM_KERNEL_NS);
    if (env == NULL || env[0] == '\0') {
        g_sim.dur_num = sim_header()->kernel_ps_per_thread;
        g_sim.dur_den = 1000;
        return CUDA_SUCCESS;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long ns = strtoull(env, &end, 10);
    if (errno != 0 || *end != '\0' || ns == 0 || env[0] == '-') {
        sim_complain("GPUPOOL_SIM_KERNEL_NS=%s is not a positive whole number of nanoseconds", env);
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_sim.dur_num = ns; /* the time of 256 blocks x 128 threads */
    g_sim.dur_den = 256 * 128;
    return CUDA_SUCCESS;
}

static void sim_identify_process(void) {
    g_sim.pid = (int)getpid();
    g_sim.start_time = gpupool_start_time(g_sim.pid);
    for (uint32_t i = 0; i < GPUPOOL_SIM_MAX_DEVICES; i++) g_sim.slot[i] = -1;
}

/* As with the real driver, a child forked after cuInit cannot use CUDA: its copies of the
 * parent's contexts and allocations are not its own, and they must not touch the parent's
 * accounting. */
static void sim_after_fork_child(void) {
    sim_identify_process();
    g_sim.initialized = 0;
    g_sim.init_result = CUDA_ERROR_NOT_INITIALIZED;
}

/* A process that calls exec keeps its pid and start time, so its slots look like its own, but
 * the old image's allocations went with the old image and its exit handler never ran. On the
 * first cuInit of an image, before it claims a slot, whatever this pid holds is the old image's:
 * give it back. */
static void sim_release_previous_image(void) {
    sim_driver_lock();
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        gpupool_sim_proc *p = sim_proc((int)s);
        if (p->pid == g_sim.pid && p->start_time == g_sim.start_time) sim_free_slot_locked(p);
    }
    sim_driver_unlock();
}

CUresult sim_attach_node(void) {
    CUresult rc = sim_map_node();
    if (rc != CUDA_SUCCESS) return rc;
    rc = sim_read_kernel_time();
    if (rc != CUDA_SUCCESS) return rc;
    sim_lock_prepare();
    sim_identify_process();
    sim_release_previous_image();
    pthread_atfork(NULL, NULL, sim_after_fork_child);
    sim_apply_visible_devices();
    return g_sim.count == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

/* At exit the process's memory goes back, as it does when a real process's contexts die. */
__attribute__((destructor)) static void sim_release_slots_at_exit(void) {
    if (!g_sim.initialized || g_sim.pid != (int)getpid()) return;
    sim_driver_lock();
    for (uint32_t i = 0; i < GPUPOOL_SIM_MAX_DEVICES; i++) {
        if (g_sim.slot[i] >= 0) {
            sim_free_slot_locked(sim_proc(g_sim.slot[i]));
            g_sim.slot[i] = -1;
        }
    }
    sim_driver_unlock();
}
