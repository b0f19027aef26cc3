"""The node as admission sees it: each GPU's capacity, less what running jobs were admitted.

Every process on a GPU also holds memory the interception library does not count: its CUDA
context and loaded modules (about 480 MiB for PyTorch on an H100, measured). Admission therefore
sets aside `reserve` bytes per job on each of its GPUs, on top of its share, so that shares that
are admitted also fit physically: a GPU's capacity for shares is its memory less one reserve
(the new job's own), and each running job takes its share plus a reserve. An exclusive job is
the one exception: it has the whole GPU, so its share is all of the GPU's memory, its context's
included, and no reserve is added on top (no other job's context will ever sit beside it).

Compute admitted is what is guaranteed: a `low` job is opportunistic (the compute arbiter runs it
only in the time the others leave), so it holds none, and it is admitted on a GPU whatever
compute the others hold there. Memory cannot be lent: every job holds its own. The rule is
scheduler/opportunistic.py's, which the Kubernetes extender places by too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from gpupool.agent.jobs import Job, JobSpec
from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode
from gpupool.core.units import MiB, format_bytes
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.scheduler import opportunistic as priority_rule
from gpupool.scheduler.gpus import GpuView

#: the default reserve on a real GPU: a PyTorch process's context on an H100 took 484 MiB past
#: its share (docs/benchmarks/daemon.md)
DEFAULT_CONTEXT_RESERVE = 512 * MiB


def capacity(snapshot: NodeSnapshot, reserve: int = 0) -> tuple[GpuView, ...]:
    """Every GPU idle, with room for shares: its memory less one `reserve`; a GPU that reports
    no more memory than that (lost) is unhealthy."""
    return tuple(
        GpuView.idle(
            g.index,
            g.model,
            max(g.memory_total - reserve, 0),
            g.healthy and g.memory_total > reserve,
        )
        for g in snapshot.gpus
    )


def in_mig_mode(snapshot: NodeSnapshot) -> frozenset[int]:
    """The GPUs in MIG mode: only MIG jobs run there."""
    return frozenset(g.index for g in snapshot.gpus if g.mig is not None and g.mig.current)


def opportunistic(spec: JobSpec) -> bool:
    """A job that holds no compute: it runs in the time the guaranteed jobs leave."""
    return priority_rule.opportunistic(spec.priority)


def guaranteed_compute(spec: JobSpec) -> int:
    """Milli-GPU `spec` holds on each of its GPUs (none for an opportunistic job)."""
    return priority_rule.guaranteed_compute(spec.priority, spec.request().compute)


def as_seen_by(spec: JobSpec, gpus: Sequence[GpuView]) -> tuple[GpuView, ...]:
    """`gpus` as `spec`'s admission sees them: to an opportunistic job, all compute is free."""
    return priority_rule.as_seen_by(spec.priority, gpus)


def share_on(spec: JobSpec, gpu: GpuView, reserve: int) -> int:
    """Bytes admitted to `spec` on `gpu` (a view of `capacity()`'s, less one reserve): its share
    of that room, or for an exclusive job the whole GPU, the reserve given back."""
    share = spec.request().memory_on(gpu)
    return share + reserve if spec.mode is Mode.EXCLUSIVE else share


def held(spec: JobSpec, share: int, reserve: int) -> int:
    """Bytes a job admitted `share` on a GPU holds there: its share and one context reserve;
    an exclusive job's share is already the whole GPU."""
    return share if spec.mode is Mode.EXCLUSIVE else share + reserve


def free_now(
    gpus: Sequence[GpuView], running: Sequence[Job], reserve: int = 0
) -> tuple[GpuView, ...]:
    """`gpus` less the compute and memory admitted to `running`, each job's memory with its
    reserve (`held`, never below zero), its compute what it is guaranteed."""
    compute = {gpu.index: gpu.compute_free for gpu in gpus}
    memory = {gpu.index: gpu.memory_free for gpu in gpus}
    for job in running:
        guaranteed = guaranteed_compute(job.spec)
        for index, taken in zip(job.gpus, job.memory, strict=False):
            if index in compute:
                compute[index] = max(0, compute[index] - guaranteed)
                memory[index] = max(0, memory[index] - held(job.spec, taken, reserve))
    return tuple(
        replace(gpu, compute_free=compute[gpu.index], memory_free=memory[gpu.index]) for gpu in gpus
    )


def host_memory() -> int:
    """The host's physical memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_burst(spec: JobSpec, room: int) -> None:
    """InvalidRequest for a burst past the share that `room` bytes could never back: a burst is
    managed memory, on the GPU while it has room and in host memory past that, so the node's
    host memory and GPU memory together bound it. Refused at submit, not failed at launch."""
    wanted = spec.burst_bytes() * spec.gpus
    if wanted > room:
        raise InvalidRequest(
            f"invalid --memory-burst {spec.memory_burst!r}: {format_bytes(wanted)} on "
            f"{spec.gpus} GPU(s) is more than this node's host and GPU memory together "
            f"({format_bytes(room)}), which back a burst"
        )
