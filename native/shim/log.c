/* Logging ("gpupool[PID]: " lines on stderr), the fatal exit, byte formatting and the clock. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

gp_log_level gp_log_threshold = GP_LOG_WARN;

static void write_line(const char *fmt, va_list args) {
    /* one write(2) per line, so lines of concurrent processes never interleave; the pid tells
     * apart the processes of one job, whose lines go to the same stderr (getpid, not a cached
     * value: a forked child logs under its own pid) */
    char line[1024];
    int n = snprintf(line, sizeof line, "gpupool[%d]: ", (int)getpid());
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, args);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t rc = write(STDERR_FILENO, line, len);
    (void)rc;
}

void gp_log(gp_log_level level, const char *fmt, ...) {
    if (level > gp_log_threshold) return;
    va_list args;
    va_start(args, fmt);
    write_line(fmt, args);
    va_end(args);
}

void gp_fatal(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    write_line(fmt, args);
    va_end(args);
    _exit(2);
}

void gp_format_bytes(uint64_t bytes, char *out, unsigned long size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned unit = 0;
    double value = (double)bytes;
    while (value >= 1024.0 && unit < 6) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0) {
        snprintf(out, size, "%llu B", (unsigned long long)bytes);
        return;
    }
    char num[32];
    snprintf(num, sizeof num, "%.1f", value);
    size_t len = strlen(num);
    if (len > 2 && strcmp(num + len - 2, ".0") == 0) num[len - 2] = '\0';
    snprintf(out, size, "%s %s", num, units[unit]);
}

uint64_t gp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * GP_NS_PER_S + (uint64_t)ts.tv_nsec;
}

void gp_sleep_ns(uint64_t ns) {
    struct timespec ts = {.tv_sec = (time_t)(ns / GP_NS_PER_S),
                          .tv_nsec = (long)(ns % GP_NS_PER_S)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
