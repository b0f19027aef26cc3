/*
 * The client side of MPS on a simulated node. As with the real driver, cuInit tries the control
 * daemon of CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps): no daemon there, and the process
 * runs as a plain time-sliced context. gpupool's twin of the control daemon (gpupool.devices.
 * mps_twin) listens on the Unix socket "control" in that directory; the client says who it is,
 * the daemon starts or names the server of the client's user, its active thread percentage and
 * its default client priority. An MPS client then runs on min(its
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the server's) of the SMs at its CUDA_MPS_CLIENT_PRIORITY (else
 * the daemon's default), beside the other clients (sim_mps_queue), its
 * CUDA_MPS_PINNED_DEVICE_MEM_LIMIT caps its memory per device, and once its server is gone every
 * launch fails, as every client of a real server that died does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "sim.h"

#define SIM_MPS_DEFAULT_PIPE_DIR "/tmp/nvidia-mps"
#define SIM_MPS_PRIORITY_NORMAL 0u
#define SIM_MPS_PRIORITY_BELOW_NORMAL 1u

static struct {
    int active;
    int server_pid;
    unsigned percent;                      /* 1..100 */
    unsigned priority;                     /* SIM_MPS_PRIORITY_* */
    uint64_t pinned[GPUPOOL_SIM_MAX_GPUS]; /* bytes per physical GPU, 0: no limit */
} g_mps;

int sim_mps_active(void) { return g_mps.active; }

int sim_mps_server_gone(void) { return kill(g_mps.server_pid, 0) != 0 && errno == ESRCH; }

uint64_t sim_mps_pinned(int phys) { return g_mps.active ? g_mps.pinned[phys] : 0; }

/* One request line, one answer line; -1: no control daemon listens there. */
static int sim_mps_ask(const char *pipe_dir, const char *request, char *answer, size_t size) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", pipe_dir) >=
        (int)sizeof addr.sun_path)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval timeout = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    size_t sent = 0, len = strlen(request), got = 0;
    while (sent < len) {
        ssize_t n = send(fd, request + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += (size_t)n;
    }
    while (sent == len && got + 1 < size) {
        ssize_t n = recv(fd, answer + got, size - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
        if (memchr(answer, '\n', got) != NULL) break;
    }
    close(fd);
    answer[got] = '\0';
    answer[strcspn(answer, "\n")] = '\0';
    return sent == len && got > 0 ? 0 : -1;
}

/* "30", "30.5": a percentage in (0, 100]; 0 when it is not one */
static double sim_mps_parse_percent(const char *text) {
    char *end = NULL;
    double value = strtod(text, &end);
    return end != text && *end == '\0' && value > 0 && value <= 100 ? value : 0;
}

/* "0=1G,1=512M": a limit per visible device ordinal, K/M/G/T binary units or bytes */
static CUresult sim_mps_parse_pinned(const char *text) {
    const char *p = text;
    while (*p != '\0') {
        char *end = NULL;
        long ordinal = strtol(p, &end, 10);
        if (end == p || *end != '=' || ordinal < 0 || ordinal >= g_sim.count)
            return CUDA_ERROR_INVALID_VALUE;
        p = end + 1;
        unsigned long long bytes = strtoull(p, &end, 10);
        if (end == p) return CUDA_ERROR_INVALID_VALUE;
        const char *units = "KMGT";
        const char *unit = *end != '\0' ? strchr(units, *end) : NULL;
        if (unit != NULL) {
            bytes <<= 10 * (unit - units + 1);
            end++;
        }
        if (*end != '\0' && *end != ',') return CUDA_ERROR_INVALID_VALUE;
        g_mps.pinned[g_sim.phys[ordinal]] = bytes;
        p = *end == ',' ? end + 1 : end;
    }
    return CUDA_SUCCESS;
}

CUresult sim_mps_connect(void) {
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (pipe_dir == NULL || pipe_dir[0] == '\0') pipe_dir = SIM_MPS_DEFAULT_PIPE_DIR;
    char request[96], answer[512];
    snprintf(request, sizeof request, "gpupool_sim_client %d %u\n", (int)getpid(),
             (unsigned)getuid());
    if (sim_mps_ask(pipe_dir, request, answer, sizeof answer) != 0)
        return CUDA_SUCCESS; /* no control daemon: a plain context, as with the real driver */
    int server_pid = 0;
    char server_percent[32] = "", server_priority[8] = "";
    if (sscanf(answer, "server %d %31s %7s", &server_pid, server_percent, server_priority) < 2 ||
        server_pid <= 0) {
        sim_complain("the MPS control daemon refused this client: %s", answer);
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    double percent = sim_mps_parse_percent(server_percent);
    if (percent == 0) percent = 100;
    const char *own = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (own != NULL && own[0] != '\0') {
        double asked = sim_mps_parse_percent(own);
        if (asked == 0) {
            sim_complain("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s is not a percentage in (0, 100]",
                         own);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (asked < percent) percent = asked;
    }
    const char *pinned = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    if (pinned != NULL && pinned[0] != '\0' && sim_mps_parse_pinned(pinned) != CUDA_SUCCESS) {
        sim_complain("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s is not ORDINAL=SIZE[,...]", pinned);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* the client's own variable wins over the control daemon's default, as with the real one */
    const char *priority = getenv("CUDA_MPS_CLIENT_PRIORITY");
    if (priority == NULL || priority[0] == '\0') priority = server_priority;
    if (strcmp(priority, "1") == 0) {
        g_mps.priority = SIM_MPS_PRIORITY_BELOW_NORMAL;
    } else if (priority[0] == '\0' || strcmp(priority, "0") == 0) {
        g_mps.priority = SIM_MPS_PRIORITY_NORMAL;
    } else {
        sim_complain("CUDA_MPS_CLIENT_PRIORITY=%s is not 0 (normal) or 1 (below normal)", priority);
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_mps.server_pid = server_pid;
    g_mps.percent = percent >= 1 ? (unsigned)(percent + 0.5) : 1;
    g_mps.active = 1;
    return CUDA_SUCCESS;
}

/* ---- MPS clients sharing a GPU's SMs --------------------------------------------------------
 *
 * What is modelled: a client's kernel may use its percentage of the SMs, and clients of one GPU
 * run at once, sharing the SMs (in percent) through each client's process slot (when its queued
 * kernels end, the SMs they occupy, its priority). A kernel occupies at most the SMs its grid
 * fills, one block per SM: a grid of fewer blocks than the GPU has SMs takes as long on that
 * part of the GPU as on all of it (a small inference kernel), so a percentage above what it
 * fills does not slow it; a grid of at least as many blocks as SMs fills the GPU and takes
 * 100/P times as long at P percent. A kernel runs on the SMs that the clients it yields to leave
 * free, slower on fewer than it occupies, and waits when none are free, as the block scheduler
 * hands a freed SM to waiting blocks: so occupancies summing to 100 or less never slow each
 * other, and only oversubscribed SMs are contended. A kernel yields to
 *  - clients of its own priority with kernels queued before it (first come, first served), and
 *  - at below normal priority, to every normal client with work queued.
 * A normal client does not yield to below-normal work already running: MPS maps a below-normal
 * client's streams under every normal stream, so the normal client's blocks take each SM the
 * below-normal kernel frees (the wait for one block to finish, microseconds, is neglected; and
 * real priorities are a hint to the driver, not a guarantee). The SMs a normal kernel takes from
 * busy below-normal clients delay them: their queued kernels keep their end times, but their next
 * launch starts that much later, so their throughput drops by what the normal clients took.
 * Not modelled: memory bandwidth and caches, stream priorities within a client.
 */

typedef struct {
    uint64_t end_ns;
    unsigned percent;
} sim_mps_busy;

/* When `work` (percent x ns) is done at up to `percent`, on the SMs that `busy` leaves free. */
static uint64_t sim_mps_finish(const sim_mps_busy *busy, int count, uint64_t start, uint64_t work,
                               unsigned percent) {
    uint64_t t = start;
    for (;;) {
        unsigned occupied = 0;
        uint64_t next = UINT64_MAX;
        for (int i = 0; i < count; i++) {
            if (busy[i].end_ns > t) {
                occupied += busy[i].percent;
                next = busy[i].end_ns < next ? busy[i].end_ns : next;
            }
        }
        uint64_t rate = occupied >= 100 ? 0 : 100 - occupied;
        rate = rate < percent ? rate : percent;
        if (rate > 0 && (next == UINT64_MAX || work <= rate * (next - t)))
            return t + (work + rate - 1) / rate;
        work -= rate * (next - t);
        t = next;
    }
}

/* A normal kernel at `rate` percent from `start` to `end`: what it takes beyond the free SMs
 * comes from the busy below-normal clients, whose next launch is delayed by it. */
static void sim_mps_delay_below_normal(int phys, const gpupool_sim_proc *self, uint64_t start,
                                       uint64_t end, uint64_t rate) {
    uint64_t occupied = 0, below = 0;
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        const gpupool_sim_proc *p = sim_proc((int)s);
        if (p == self || p->pid == 0 || p->gpu != phys || p->mps_end_ns <= start) continue;
        occupied += p->mps_percent;
        if (p->mps_priority == SIM_MPS_PRIORITY_BELOW_NORMAL) below += p->mps_percent;
    }
    uint64_t free_sms = occupied >= 100 ? 0 : 100 - occupied;
    if (below == 0 || rate <= free_sms) return;
    uint64_t taken = rate - free_sms < below ? rate - free_sms : below;
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        gpupool_sim_proc *p = sim_proc((int)s);
        if (p == self || p->pid == 0 || p->gpu != phys || p->mps_end_ns <= start ||
            p->mps_priority != SIM_MPS_PRIORITY_BELOW_NORMAL)
            continue;
        uint64_t overlap = (p->mps_end_ns < end ? p->mps_end_ns : end) - start;
        p->mps_end_ns += overlap * taken / below; /* each loses its part of `taken` */
    }
}

/* The percent of the SMs of GPU `phys` that a grid of `blocks` blocks fills, one block per SM. */
static unsigned sim_mps_grid_percent(int phys, uint64_t blocks) {
    uint64_t sms = sim_gpu(phys)->sm_count;
    if (sms == 0 || blocks >= sms) return 100;
    return (unsigned)((blocks * 100 + sms - 1) / sms);
}

/* Queues one kernel of this client (`duration_ns` on the whole GPU, `blocks` blocks) after its
 * earlier work, on the SMs the model above gives it. Returns its end time. */
uint64_t sim_mps_queue(int phys, uint64_t *stream_end, uint64_t duration_ns, uint64_t blocks) {
    sim_driver_lock();
    gpupool_sim_proc *self = sim_slot_locked(phys);
    uint64_t now = sim_now_ns();
    uint64_t start = __atomic_load_n(stream_end, __ATOMIC_ACQUIRE);
    start = start > now ? start : now;
    if (self != NULL && self->mps_end_ns > start) /* its own earlier work, and any delay */
        start = self->mps_end_ns;
    sim_mps_busy busy[GPUPOOL_SIM_MAX_PROCS];
    int count = 0;
    for (uint32_t s = 0; s < GPUPOOL_SIM_MAX_PROCS; s++) {
        const gpupool_sim_proc *p = sim_proc((int)s);
        if (p != self && p->pid != 0 && p->gpu == phys && p->mps_end_ns > start &&
            p->mps_priority <= g_mps.priority)
            busy[count++] = (sim_mps_busy){p->mps_end_ns, p->mps_percent};
    }
    /* percent x ns: the SMs the grid fills for as long as it takes on the whole GPU */
    unsigned fills = sim_mps_grid_percent(phys, blocks);
    uint64_t work = sim_on_device_ns(phys, duration_ns) * fills;
    unsigned occupies = fills < g_mps.percent ? fills : g_mps.percent;
    uint64_t end = sim_mps_finish(busy, count, start, work, occupies);
    if (g_mps.priority == SIM_MPS_PRIORITY_NORMAL && end > start)
        sim_mps_delay_below_normal(phys, self, start, end, work / (end - start));
    if (self != NULL) {
        /* a narrow kernel queued behind wider ones of the same client does not free their SMs */
        int pending = self->mps_end_ns > now;
        if (!pending || occupies > self->mps_percent) self->mps_percent = occupies;
        self->mps_end_ns = end > self->mps_end_ns ? end : self->mps_end_ns;
        self->mps_priority = g_mps.priority;
    }
    __atomic_store_n(stream_end, end, __ATOMIC_RELEASE);
    sim_charge_locked(phys, self, duration_ns, now);
    sim_driver_unlock();
    return end;
}
