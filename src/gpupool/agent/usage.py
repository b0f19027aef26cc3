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


def _add(before: Usage, memory: int, utilization: int | None) -> Usage:
    """`before` with `memory` more bytes, and the higher of the two utilisations known."""
    if utilization is None or (before.utilization or 0) > utilization:
        utilization = before.utilization
    return Usage(before.memory + memory, utilization)


def usage_per_gpu(
    snapshot: NodeSnapshot, groups: Mapping[int, int]
) -> dict[tuple[int, int], Usage]:
    """Memory and utilisation per (job id, GPU index); `groups` maps process group to job id."""
    found: dict[tuple[int, int], Usage] = {}
    for gpu in snapshot.gpus:
        for process in gpu.processes:
            job = groups.get(process_group(process.pid) or -1)
            if job is None:
                continue
            before = found.get((job, gpu.index), Usage(0, None))
            used = process.memory_used or 0
            found[(job, gpu.index)] = _add(before, used, process.gpu_utilization)
    return found


def job_usage(snapshot: NodeSnapshot, groups: Mapping[int, int]) -> dict[int, Usage]:
    """Usage per job id, over all its GPUs; `groups` maps a job's process group to its id."""
    found: dict[int, Usage] = {}
    for (job, _index), usage in usage_per_gpu(snapshot, groups).items():
        found[job] = _add(found.get(job, Usage(0, None)), usage.memory, usage.utilization)
    return found
