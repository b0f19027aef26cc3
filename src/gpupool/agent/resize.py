"""Resize of a running shim job's share (memory, compute), admission re-checked on its GPUs.

The new limits are written into the job's accounting region: the interception library reads the
memory limit at every allocation and the compute percent at every batch of launches, so they
hold from the job's next call on. A new compute share also becomes the share's weight at the
node's trusted arbiter, which splits a busy GPU between shares by those weights. Growing must
fit beside the other jobs on the job's GPUs; shrinking memory below what the job holds is
refused with the numbers. MPS and MIG shares cannot
change while they run (MPS fixes a client's active thread percentage when it connects; a MIG
instance is the share), so they are refused, as is an exclusive job, which has nothing to resize.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from gpupool.agent import node
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.logs import about_job
from gpupool.core.errors import DeviceError, InvalidRequest, Unschedulable
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, format_bytes
from gpupool.isolation import elastic as region_io
from gpupool.scheduler.gpus import GpuView

_REFUSED = {
    Mode.MPS: "MPS cannot change a running client's active thread percentage or pinned memory "
    "limit: cancel it and submit it again with the new share",
    Mode.MIG: "its share is its MIG instance, which cannot change under it: cancel it and submit "
    "it again with another --mig-profile",
    Mode.EXCLUSIVE: "it holds whole GPUs: there is no share to resize",
}


def apply_compute(
    job: Job, region: Path, percent: int, set_weight: Callable[[int, int], None]
) -> None:
    """Give the running `job` `percent` of each of its GPUs: the one place a compute resize is
    carried out. The library's throttle caps the share at the percent in its region (read at
    each batch of launches); `set_weight(job_id, percent)` changes its weight at the node's
    arbiter. An arbiter that is away takes the new weight when the daemon registers the job's
    share with it again, from the job's record (which the caller updates)."""
    region_io.set_compute_limit(region, range(len(job.gpus)), percent)
    try:
        set_weight(job.id, percent)
    except DeviceError as err:
        about_job(job).warning("its compute weight at the arbiter: %s (its cap holds)", err)


def apply_memory(region: Path, memory: Sequence[int]) -> None:
    """The share's memory limit on each of its GPUs (ordinal i: `memory[i]` bytes)."""
    for ordinal, limit in enumerate(memory):
        region_io.set_memory_limit(region, range(ordinal, ordinal + 1), limit)


def _percent(milli: int) -> int:
    return max(1, round(milli * 100 / MILLI_PER_GPU))


def plan_resize(
    job: Job,
    memory: str | None,
    compute: int | None,
    state: region_io.ShareMemory | None,
    capacity: Sequence[GpuView],
    others: Sequence[Job],
    reserve: int,
) -> tuple[JobSpec, tuple[int, ...], str]:
    """The job's new spec, bytes per GPU and a line saying what changed; InvalidRequest or
    Unschedulable (one line, nothing changed) when it cannot be."""
    if job.state is not State.RUNNING:
        raise InvalidRequest(
            f"job {job.id} is {job.state.value}: only a running job can be resized"
        )
    if job.spec.mode in _REFUSED:
        raise InvalidRequest(
            f"job {job.id} runs in mode {job.spec.mode.value}: {_REFUSED[job.spec.mode]}"
        )
    if memory is None and compute is None:
        raise InvalidRequest("nothing to resize: give a new memory share, compute share or both")
    if state is None:
        raise InvalidRequest(f"job {job.id} has not started its share yet: resize it once it runs")
    spec = replace(
        job.spec,
        memory=memory if memory is not None else job.spec.memory,
        compute=compute if compute is not None else job.spec.compute,
    )
    gpus = {g.index: g for g in capacity}
    new_memory = tuple(node.share_on(spec, gpus[g], reserve) for g in job.gpus)
    n = len(job.gpus)
    if compute is not None and compute < MILLI_PER_GPU and min(state.compute_limit[:n]) >= 100:
        raise InvalidRequest(
            f"job {job.id} started without a compute limit, so its processes do not throttle: a "
            "running job's compute share can be changed, not added"
        )
    spills = 0
    for ordinal, gpu in enumerate(job.gpus):
        held, want = state.used[ordinal], new_memory[ordinal]
        burst_room = spec.burst_bytes() - state.burst_used[ordinal] if spec.memory_burst else 0
        if held > want and held - want <= burst_room:
            spills = max(spills, held - want)  # the library moves it into the job's burst
        elif held > want:
            if spec.memory_burst:
                raise InvalidRequest(
                    f"job {job.id} holds {format_bytes(held)} on GPU {gpu}: its share cannot "
                    f"shrink to {format_bytes(want)} (its burst has {format_bytes(burst_room)} "
                    f"left for the {format_bytes(held - want)} past it)"
                )
            raise InvalidRequest(
                f"job {job.id} holds {format_bytes(held)} on GPU {gpu}: its share cannot shrink "
                f"to {format_bytes(want)} (it would have to free {format_bytes(held - want)} "
                "first)"
            )
    free = {g.index: g for g in node.free_now(capacity, others, reserve)}
    guaranteed = node.guaranteed_compute(spec)
    for gpu, want in zip(job.gpus, new_memory, strict=True):
        room = free[gpu].memory_free
        if node.held(spec, want, reserve) > room:
            raise Unschedulable(
                f"job {job.id} cannot grow to {format_bytes(want)} on GPU {gpu}: "
                f"{format_bytes(room)} is free for shares there"
            )
        if spec.priority is Priority.HIGH and guaranteed > free[gpu].compute_free:
            raise Unschedulable(
                f"job {job.id} cannot take {_percent(guaranteed)}% of GPU {gpu}: "
                f"{free[gpu].compute_free * 100 // MILLI_PER_GPU}% of it is free"
            )
    said = []
    if memory is not None:
        said.append(f"memory {format_bytes(job.memory[0])} -> {format_bytes(new_memory[0])}")
    if spills:
        said[-1] += f" ({format_bytes(spills)} spills into its burst)"
    if compute is not None:
        said.append(f"compute {_percent(job.spec.compute)}% -> {_percent(spec.compute)}%")
    return spec, new_memory, ", ".join(said)
