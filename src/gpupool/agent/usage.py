"""Live GPU memory and utilisation per job, from the devices layer's snapshot.

A GPU process belongs to a job when it is in the job's process group (the job's pid is its
group id); peaks are kept here and written to the store when the job ends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.devices.snapshot import NodeSnapshot


@dataclass(frozen=True)
class Usage:
    memory: int  # bytes over all the job's GPUs
    utilization: int | None  # percent, the highest of its GPUs


def process_group(pid: int) -> int | None:
    """The process group of `pid`, None when it has gone."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def job_usage(snapshot: NodeSnapshot, groups: Mapping[int, int]) -> dict[int, Usage]:
    """Usage per job id; `groups` maps a job's process group to its id."""
    memory: dict[int, int] = {}
    utilization: dict[int, int | None] = {}
    for gpu in snapshot.gpus:
        for process in gpu.processes:
            job = groups.get(process_group(process.pid) or -1)
            if job is None:
                continue
            memory[job] = memory.get(job, 0) + (process.memory_used or 0)
            util = process.gpu_utilization
            if util is not None:
                utilization[job] = max(util, utilization.get(job) or 0)
            else:
                utilization.setdefault(job, None)
    return {job: Usage(memory[job], utilization.get(job)) for job in memory}
