/*
 * The client side of MPS on a simulated node. As with the real driver, cuInit tries the control
 * daemon of CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps): no daemon there, and the process
 * runs as a plain time-sliced context. gpupool's twin of the control daemon (gpupool.devices.
 * mps_twin) listens on the Unix socket "control" in that directory; the client says who it is,
 * the daemon starts or names the server of the client's user and its active thread percentage.
 * An MPS client then gets min(its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the server's) of the SMs
 * (launch.c), its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT caps its memory per device, and once its
 * server is gone every launch fails, as every client of a real server that died does.
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

static struct {
    int active;
    int server_pid;
    unsigned percent;                        /* 1..100 */
    uint64_t pinned[GPUPOOL_SIM_MAX_GPUS];   /* bytes per physical GPU, 0: no limit */
} g_mps;

int sim_mps_active(void) { return g_mps.active; }

unsigned sim_mps_percent(void) { return g_mps.percent; }

int sim_mps_server_gone(void) { return kill(g_mps.server_pid, 0) != 0 && errno == ESRCH; }

int sim_mps_pinned_fits(int phys, uint64_t used, uint64_t size)
{
    uint64_t limit = g_mps.active ? g_mps.pinned[phys] : 0;
    return limit == 0 || (used <= limit && size <= limit - used);
}

/* One request line, one answer line; -1: no control daemon listens there. */
static int sim_mps_ask(const char *pipe_dir, const char *request, char *answer, size_t size)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", pipe_dir) >=
        (int)sizeof addr.sun_path)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval timeout = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    size_t sent = 0, len = strlen(request), got = 0;
    while (sent < len) {
        ssize_t n = send(fd, request + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        sent += (size_t)n;
    }
    while (sent == len && got + 1 < size) {
        ssize_t n = recv(fd, answer + got, size - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
        if (memchr(answer, '\n', got) != NULL)
            break;
    }
    close(fd);
    answer[got] = '\0';
    answer[strcspn(answer, "\n")] = '\0';
    return sent == len && got > 0 ? 0 : -1;
}

/* "30", "30.5": a percentage in (0, 100]; 0 when it is not one */
static double sim_mps_parse_percent(const char *text)
{
    char *end = NULL;
    double value = strtod(text, &end);
    return end != text && *end == '\0' && value > 0 && value <= 100 ? value : 0;
}

/* "0=1G,1=512M": a limit per visible device ordinal, K/M/G/T binary units or bytes */
static CUresult sim_mps_parse_pinned(const char *text)
{
    const char *p = text;
    while (*p != '\0') {
        char *end = NULL;
        long ordinal = strtol(p, &end, 10);
        if (end == p || *end != '=' || ordinal < 0 || ordinal >= g_sim.count)
            return CUDA_ERROR_INVALID_VALUE;
        p = end + 1;
        unsigned long long bytes = strtoull(p, &end, 10);
        if (end == p)
            return CUDA_ERROR_INVALID_VALUE;
        const char *units = "KMGT";
        const char *unit = *end != '\0' ? strchr(units, *end) : NULL;
        if (unit != NULL) {
            bytes <<= 10 * (unit - units + 1);
            end++;
        }
        if (*end != '\0' && *end != ',')
            return CUDA_ERROR_INVALID_VALUE;
        g_mps.pinned[g_sim.phys[ordinal]] = bytes;
        p = *end == ',' ? end + 1 : end;
    }
    return CUDA_SUCCESS;
}

CUresult sim_mps_connect(void)
{
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (pipe_dir == NULL || pipe_dir[0] == '\0')
        pipe_dir = SIM_MPS_DEFAULT_PIPE_DIR;
    char request[96], answer[512];
    snprintf(request, sizeof request, "gpupool_sim_client %d %u\n", (int)getpid(),
             (unsigned)getuid());
    if (sim_mps_ask(pipe_dir, request, answer, sizeof answer) != 0)
        return CUDA_SUCCESS; /* no control daemon: a plain context, as with the real driver */
    int server_pid = 0;
    char server_percent[32] = "";
    if (sscanf(answer, "server %d %31s", &server_pid, server_percent) != 2 || server_pid <= 0) {
        sim_complain("the MPS control daemon refused this client: %s", answer);
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    double percent = sim_mps_parse_percent(server_percent);
    if (percent == 0)
        percent = 100;
    const char *own = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (own != NULL && own[0] != '\0') {
        double asked = sim_mps_parse_percent(own);
        if (asked == 0) {
            sim_complain("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s is not a percentage in (0, 100]",
                         own);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (asked < percent)
            percent = asked;
    }
    const char *pinned = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    if (pinned != NULL && pinned[0] != '\0' && sim_mps_parse_pinned(pinned) != CUDA_SUCCESS) {
        sim_complain("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s is not ORDINAL=SIZE[,...]", pinned);
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_mps.server_pid = server_pid;
    g_mps.percent = percent >= 1 ? (unsigned)(percent + 0.5) : 1;
    g_mps.active = 1;
    return CUDA_SUCCESS;
}
