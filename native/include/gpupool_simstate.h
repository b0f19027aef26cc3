/*
 * The shared state file of a simulated node (state.bin in the node directory).
 *
 * Created by Python (gpupool.devices.simstate), mapped MAP_SHARED by every process that runs on the
 * simulated CUDA driver, read by the simulated NVML backend. The layout is fixed and little-endian;
 * Python mirrors these offsets in src/gpupool/devices/sim/state.py: change both together and bump
 * GPUPOOL_SIMSTATE_VERSION.
 */
#ifndef GPUPOOL_SIMSTATE_H
#define GPUPOOL_SIMSTATE_H

#include <stdint.h>

#define GPUPOOL_SIMSTATE_MAGIC 0x314d49534c505047ULL /* "GPPLSIM1" read as little-endian u64 */
#define GPUPOOL_SIMSTATE_VERSION 3u
#define GPUPOOL_SIM_MAX_GPUS 16u
#define GPUPOOL_SIM_MAX_PROCS 256u
#define GPUPOOL_SIM_HEADER_SIZE 4096u
#define GPUPOOL_SIM_GPU_RECORD_SIZE 512u
#define GPUPOOL_SIM_PROC_RECORD_SIZE 64u
#define GPUPOOL_SIM_GPUS_OFFSET GPUPOOL_SIM_HEADER_SIZE
#define GPUPOOL_SIM_PROCS_OFFSET                                                                   \
    (GPUPOOL_SIM_GPUS_OFFSET + GPUPOOL_SIM_MAX_GPUS * GPUPOOL_SIM_GPU_RECORD_SIZE)
/* MIG instances: one record per (GPU, GPU instance id 1..7), the same layout as a GPU's, after
 * the process table. The driver numbers devices 0..MAX_GPUS-1 for GPUs and MAX_GPUS + k for
 * instance record k = gpu * GPUPOOL_SIM_MIG_PER_GPU + gi_id - 1 (process slots use that number). */
#define GPUPOOL_SIM_MIG_PER_GPU 7u
#define GPUPOOL_SIM_MAX_MIG (GPUPOOL_SIM_MAX_GPUS * GPUPOOL_SIM_MIG_PER_GPU)
#define GPUPOOL_SIM_MAX_DEVICES (GPUPOOL_SIM_MAX_GPUS + GPUPOOL_SIM_MAX_MIG)
#define GPUPOOL_SIM_MIG_OFFSET                                                                     \
    (GPUPOOL_SIM_PROCS_OFFSET + GPUPOOL_SIM_MAX_PROCS * GPUPOOL_SIM_PROC_RECORD_SIZE)
#define GPUPOOL_SIM_STATE_SIZE                                                                     \
    (GPUPOOL_SIM_MIG_OFFSET + GPUPOOL_SIM_MAX_MIG * GPUPOOL_SIM_GPU_RECORD_SIZE)

/* process kinds (a slot's `kind`): which of NVML's lists the process is in. The simulated driver
 * serves CUDA only, so the slots it claims are zero-filled: compute. A graphics context (a display
 * server, a desktop) is staged by Python. */
#define GPUPOOL_SIM_PROC_COMPUTE 0u
#define GPUPOOL_SIM_PROC_GRAPHICS 1u
#define GPUPOOL_SIM_PROC_BOTH 2u

/* gpu flags, set by Python to stage scenarios */
#define GPUPOOL_SIM_GPU_LOST 0x1u          /* fell off the bus: driver and NVML calls fail */
#define GPUPOOL_SIM_GPU_NOT_SUPPORTED 0x2u /* NVML answers NotSupported for optional queries */

/* Header: offset 0, GPUPOOL_SIM_HEADER_SIZE bytes; Python zero-fills what it does not set. */
typedef struct {
    uint64_t magic;                /* 0   GPUPOOL_SIMSTATE_MAGIC */
    uint32_t version;              /* 8   GPUPOOL_SIMSTATE_VERSION */
    uint32_t gpu_count;            /* 12  GPUs in use, <= GPUPOOL_SIM_MAX_GPUS */
    uint32_t proc_slots;           /* 16  GPUPOOL_SIM_MAX_PROCS */
    uint32_t header_size;          /* 20  GPUPOOL_SIM_HEADER_SIZE */
    uint32_t gpu_record_size;      /* 24  GPUPOOL_SIM_GPU_RECORD_SIZE */
    uint32_t proc_record_size;     /* 28  GPUPOOL_SIM_PROC_RECORD_SIZE */
    uint64_t kernel_ps_per_thread; /* 32  simulated kernel time per thread, picoseconds
                                          (30518: 256 blocks x 128 threads = 1 ms) */
    uint8_t reserved_py[24];       /* 40  Python's, zero */
    uint8_t driver_lock[128];      /* 64  the simulated driver's own (robust, process-shared) lock
                                          state; zero at creation; Python never touches it */
} gpupool_sim_header;

/* One GPU: at GPUPOOL_SIM_GPUS_OFFSET + index * GPUPOOL_SIM_GPU_RECORD_SIZE; one MIG instance:
 * at GPUPOOL_SIM_MIG_OFFSET + k * GPUPOOL_SIM_GPU_RECORD_SIZE (its uuid "MIG-...", its own memory,
 * SMs and kernel timeline: instances run side by side). */
typedef struct {
    char uuid[48];            /* 0   "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", NUL-terminated */
    char name[96];            /* 48  marketing name, "NVIDIA H100 80GB HBM3" */
    char model[32];           /* 144 gpupool model name, "H100-80GB" */
    uint64_t memory_total;    /* 176 bytes */
    uint64_t memory_used;     /* 184 bytes, sum over live process slots (driver keeps it) */
    uint64_t busy_ns_total;   /* 192 cumulative simulated kernel time (CLOCK_MONOTONIC ns) */
    uint64_t busy_until_ns;   /* 200 CLOCK_MONOTONIC ns at which the last queued kernel ends */
    uint32_t sm_count;        /* 208 */
    uint32_t cc_major;        /* 212 compute capability */
    uint32_t cc_minor;        /* 216 */
    uint32_t flags;           /* 220 GPUPOOL_SIM_GPU_* */
    char pci_bus_id[32];      /* 224 "00000000:17:00.0" */
    uint32_t mig_parent;      /* 256 an instance record: its GPU's index + 1; 0: a GPU, or a free
                                     instance record (Python writes it when MIG layouts change) */
    uint32_t link_pad;        /* 260 elastic memory (Python's, at creation): zero */
    uint64_t link_bytes_s;    /* 264 elastic memory: the host link, bytes/s (0: copies free) */
    uint8_t reserved_py[112]; /* 272 Python's, zero */
    uint8_t driver_private[128]; /* 384 the simulated driver's own per-GPU state */
} gpupool_sim_gpu;

/* One (process, GPU) pair: at GPUPOOL_SIM_PROCS_OFFSET + slot * GPUPOOL_SIM_PROC_RECORD_SIZE.
 * pid 0 = free slot. A slot whose pid is gone, or whose start_time differs from the live process's
 * (pid reused), is dead: readers skip it, the driver reclaims it. */
typedef struct {
    int32_t pid;             /* 0 */
    int32_t gpu;             /* 4  device number: GPU index, or MAX_GPUS + MIG record */
    uint64_t start_time;     /* 8  field 22 of /proc/PID/stat (clock ticks since boot) */
    uint64_t memory_used;    /* 16 bytes this process holds on this GPU */
    uint64_t busy_ns;        /* 24 cumulative simulated kernel time of this process here */
    uint64_t last_launch_ns; /* 32 CLOCK_MONOTONIC ns of its latest launch */
    /* the driver's own, for an MPS client (zero otherwise, and in state files of before) */
    uint64_t mps_end_ns;   /* 40 CLOCK_MONOTONIC ns at which its queued kernels end */
    uint32_t mps_percent;  /* 48 the SMs (percent) its queued kernels occupy */
    uint32_t mps_priority; /* 52 its client priority: 0 normal, 1 below normal */
    uint32_t kind;         /* 56 GPUPOOL_SIM_PROC_*: which of NVML's lists the process is in */
    uint8_t reserved[4];   /* 60 */
} gpupool_sim_proc;

#endif /* GPUPOOL_SIMSTATE_H */
