/* What every part of the arbiter's process shares and calls, at the bottom of its parts: the
 * GPUs, the runtime directory, the clock, the rate-limited log and the answer to a connection. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

#include "arbiterd.h"

gpu gpus[ARB_MAX_GPUS];
int gpu_count;

int dir_fd = -1;

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* at most SAY_PER_MINUTE lines a minute: what clients send cannot fill the daemon's disk */
#define SAY_PER_MINUTE 100
void say(const char *fmt, ...) {
    static uint64_t window;
    static int said, dropped;
    uint64_t minute = now_ns() / (60 * 1000000000ULL);
    if (minute != window) {
        if (dropped) fprintf(stderr, "gpupool-arbiterd: %d more lines not written\n", dropped);
        window = minute;
        said = dropped = 0;
    }
    if (said++ >= SAY_PER_MINUTE) {
        dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fputs("gpupool-arbiterd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int answer(conn *c, uint32_t kind, uint32_t arg, uint64_t value) {
    gpupool_arbiter_msg m = {.kind = kind, .arg = arg, .value = value};
    return send(c->fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof m ? 0 : -1;
}
