/* A process's start time: field 22 of /proc/PID/stat (clock ticks after boot), which with the
 * pid tells a process from a later one given the same pid. Used by the interception library, the
 * simulated driver and the arbiter daemon, each compiling its own copy of this inline function. */
#ifndef GPUPOOL_PIDSTAT_H
#define GPUPOOL_PIDSTAT_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 0 when the process is gone */
static inline uint64_t gpupool_start_time(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    /* the command name (field 2) may hold spaces and parentheses: count from the last ')' */
    char *p = strrchr(buf, ')');
    for (int field = 2; p != NULL && field < 22; field++) p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

#endif /* GPUPOOL_PIDSTAT_H */
