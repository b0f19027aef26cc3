"""The node as admission sees it: each GPU's capacity, less what running jobs were admitted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.agent.jobs import Job
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.scheduler.gpus import GpuView


def capacity(snapshot: NodeSnapshot) -> tuple[GpuView, ...]:
    """Every GPU idle; a GPU that reports no memory (lost) is unhealthy."""
    return tuple(
        GpuView.idle(g.index, g.model, max(g.memory_total, 0), g.healthy and g.memory_total > 0)
        for g in snapshot.gpus
    )


def free_now(gpus: Sequence[GpuView], running: Sequence[Job]) -> tuple[GpuView, ...]:
    """`gpus` less the compute and memory admitted to `running` (never below zero)."""
    compute = {gpu.index: gpu.compute_free for gpu in gpus}
    memory = {gpu.index: gpu.memory_free for gpu in gpus}
    for job in running:
        request = job.spec.request()
        for index, taken in zip(job.gpus, job.memory, strict=False):
            if index in compute:
                compute[index] = max(0, compute[index] - request.compute)
                memory[index] = max(0, memory[index] - taken)
    return tuple(
        replace(gpu, compute_free=compute[gpu.index], memory_free=memory[gpu.index]) for gpu in gpus
    )
