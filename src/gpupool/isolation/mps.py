"""An MPS client's settings: which control daemon, how many SMs, its priority, a memory backstop.

MPS provisions SMs, not time: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the share of the GPU's SMs
a client's kernels may occupy, and clients of one server run at once. A job's priority becomes
its client priority (CUDA_MPS_CLIENT_PRIORITY, 0 normal, 1 below normal): MPS maps a below-normal
client's stream priorities under a normal client's, so where the clients' SMs are oversubscribed
the normal client's work is scheduled first, block by block. NVIDIA calls it a hint to the
driver, not a guarantee of execution order; it preempts nothing already running. The memory
share is still enforced exactly by the interception library, as in `shim` mode; MPS's own pinned
device memory limit stays above it as a backstop, since MPS counts the client's CUDA context in
that limit (a limit equal to the share would refuse a framework's first allocation).
"""

from __future__ import annotations

from pathlib import Path

from gpupool.core.resources import Priority
from gpupool.core.units import MILLI_PER_GPU, MiB

#: room above the share in MPS's pinned limit for what MPS counts and the shim does not: the
#: client's context (a few hundred MiB with PyTorch on an H100)
PINNED_HEADROOM = 1024 * MiB

#: CUDA_MPS_CLIENT_PRIORITY per priority; `high` is set too (normal), so that a job's own
#: environment cannot raise a `low` job, nor leave a `high` one below normal
CLIENT_PRIORITY = {Priority.HIGH: "0", Priority.LOW: "1"}


def thread_percentage(compute_milli: int) -> int:
    """A compute share as a whole active thread percentage, 1..100."""
    return max(1, min(100, round(compute_milli * 100 / MILLI_PER_GPU)))


def mps_client_env(
    pipe_dir: Path, visible: str, compute_milli: int, memory: int | None, priority: Priority
) -> dict[str, str]:
    """What makes a process a client of the MPS server in `pipe_dir`, with its share and
    priority; `visible` names its one GPU as the control daemon names it (the UUID)."""
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
        "CUDA_VISIBLE_DEVICES": visible,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percentage(compute_milli)),
        "CUDA_MPS_CLIENT_PRIORITY": CLIENT_PRIORITY[priority],
    }
    if memory is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={(memory + PINNED_HEADROOM) // MiB}M"
    return env
