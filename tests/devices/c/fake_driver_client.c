/*
 * A stand-in for a process on the simulated CUDA driver: maps a node's state.bin through
 * gpupool_simstate.h, takes a process slot on a GPU with some memory and busy time, as the
 * driver does for each process, prints "ready" and waits to be killed. With "graphics", the slot
 * says the process is graphics only, as a staged display server's does.
 * usage: fake_driver_client STATE_FILE GPU SLOT MEMORY_BYTES BUSY_NS [graphics]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpupool_simstate.h"

static unsigned long long own_start_time(void) {
    char buf[4096];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f || !fgets(buf, sizeof buf, f)) return 0;
    fclose(f);
    /* the command name (field 2) may hold spaces: start after the last ')' */
    char *p = strrchr(buf, ')') + 2; /* field 3, the state letter */
    p = strchr(p, ' ') + 1;          /* field 4 */
    unsigned long long value = 0;
    for (int field = 4; field <= 22; field++) value = strtoull(p, &p, 10);
    return value;
}

int main(int argc, char **argv) {
    if (argc != 6 && !(argc == 7 && strcmp(argv[6], "graphics") == 0)) return 2;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) return 3;
    unsigned char *base = mmap(NULL, GPUPOOL_SIM_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
                               fd, 0);
    if (base == MAP_FAILED) return 4;
    gpupool_sim_header *header = (gpupool_sim_header *)base;
    if (header->magic != GPUPOOL_SIMSTATE_MAGIC || header->version != GPUPOOL_SIMSTATE_VERSION)
        return 5;
    int gpu_index = atoi(argv[2]);
    gpupool_sim_gpu *gpu =
        (gpupool_sim_gpu *)(base + GPUPOOL_SIM_GPUS_OFFSET + gpu_index * GPUPOOL_SIM_GPU_RECORD_SIZE);
    gpupool_sim_proc *slot =
        (gpupool_sim_proc *)(base + GPUPOOL_SIM_PROCS_OFFSET +
                             atoi(argv[3]) * GPUPOOL_SIM_PROC_RECORD_SIZE);
    unsigned long long memory = strtoull(argv[4], NULL, 10);
    slot->gpu = gpu_index;
    slot->start_time = own_start_time();
    slot->memory_used = memory;
    slot->busy_ns = strtoull(argv[5], NULL, 10);
    slot->kind = argc == 7 ? GPUPOOL_SIM_PROC_GRAPHICS : GPUPOOL_SIM_PROC_COMPUTE;
    slot->pid = getpid();
    gpu->memory_used += memory;
    gpu->busy_ns_total += slot->busy_ns;
    printf("ready %s %llu\n", gpu->model, (unsigned long long)slot->start_time);
    fflush(stdout);
    pause();
    return 0;
}
