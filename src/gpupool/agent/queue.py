"""Which queued jobs start now: priority, then first come first served, with safe backfill.

The rule (docs/architecture.md): jobs are taken in queue order (`high` before `low`, then by
submission). A job that fits now starts. A job that does not fit blocks: a later job may still
start now (backfill) only if, on every GPU it takes, each blocked job ahead of it could still
fit beside it and every job behind it started on that GPU since it was submitted, once the
GPU's other occupants have ended; or could never use that GPU at all (its model, or a share
larger than the GPU). So a backfilled job never takes room that a job ahead of it waits for:
a blocked job waits only for what was already running when it was submitted.

Memory a job takes on a GPU is its share plus the node's context reserve, an exclusive job's the
whole GPU (agent/node.py); the GPUs passed in already leave one reserve aside for the job being
placed. Compute a job takes is what it is guaranteed: none for a `low` job, which is admitted
whatever compute the others hold (node.opportunistic).

Jobs of one spread group (a service's replicas, `JobSpec.spread_group`) avoid the GPUs that a
running job of the group, or one started earlier in the pass, holds: the engine's `avoid`
(scheduler/gpu_placement.py), a preference that never keeps a job from starting: where the
spread placement would delay a blocked job, the job is placed as without it. Jobs of a spread
group place with REPLICA_POLICY whatever the node's policy: services pack onto few GPUs.

An MPS job never places on a GPU whose MPS server serves another user (one user's server per GPU
at a time, docs/modes.md): it takes another GPU that fits, or waits, saying whose server it
waits for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpupool.agent.jobs import Job, JobSpec, queue_order
from gpupool.agent.node import as_seen_by, guaranteed_compute, held, opportunistic, share_on
from gpupool.core.resources import Mode
from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.gpu_placement import gpu_shortfalls, place
from gpupool.scheduler.gpus import GpuRequest, GpuView, take
from gpupool.scheduler.workload import TargetWorkload


@dataclass(frozen=True)
class Start:
    """A job to start now on `gpus`, with the bytes it takes on each."""

    job: Job
    gpus: tuple[int, ...]
    memory: tuple[int, ...]
    backfill: bool


@dataclass(frozen=True)
class Plan:
    """What to start, and for every job left queued, why (one line each)."""

    starts: tuple[Start, ...]
    waiting: dict[int, tuple[str, ...]]


def _never_uses(blocked: GpuRequest, gpu: GpuView) -> bool:
    return not blocked.allows(gpu) or blocked.memory_on(gpu) > gpu.memory_total


@dataclass(frozen=True)
class _Taken:
    """Room a job took on one GPU, when it started (inf: in this pass), its place in the queue."""

    gpu: int
    started: float
    order: tuple[int, int]
    compute: int
    memory: int


def _taken_by(jobs: Sequence[Job], reserve: int) -> list[_Taken]:
    taken = []
    for job in jobs:
        compute = guaranteed_compute(job.spec)
        started = job.started_at if job.started_at is not None else math.inf
        for gpu, memory in zip(job.gpus, job.memory, strict=False):
            taken.append(
                _Taken(gpu, started, queue_order(job), compute, held(job.spec, memory, reserve))
            )
    return taken


def _delays(
    blocked: Sequence[Job],
    gpu: GpuView,
    spec: JobSpec,
    taken: Sequence[_Taken],
    reserve: int,
) -> int | None:
    """The id of a blocked job that `spec` on `gpu` would delay, or None.

    A blocked job waits only for what ran before it was submitted and for jobs ahead of it:
    room on `gpu` taken by jobs behind it started since (backfills), plus `spec`'s, must still
    leave room for it there.
    """
    for job in blocked:
        ahead = job.spec.request()
        if _never_uses(ahead, gpu):
            continue
        later = [
            t
            for t in taken
            if t.gpu == gpu.index and t.started >= job.submitted_at and t.order > queue_order(job)
        ]
        compute = guaranteed_compute(spec) + sum(t.compute for t in later)
        memory = held(spec, share_on(spec, gpu, reserve), reserve) + sum(t.memory for t in later)
        if memory > gpu.memory_total or (compute > MILLI_PER_GPU and not opportunistic(job.spec)):
            return job.id
        beside = replace(
            gpu,
            compute_free=max(0, MILLI_PER_GPU - compute),
            memory_free=gpu.memory_total - memory,
            healthy=True,
        )
        if gpu_shortfalls(ahead, as_seen_by(job.spec, [beside])[0]):
            return job.id
    return None


def _after(
    gpus: Sequence[GpuView], spec: JobSpec, chosen: Sequence[int], reserve: int
) -> tuple[GpuView, ...]:
    """`gpus` once `spec` took its room on `chosen`: its share and a context reserve of memory,
    and the compute it is guaranteed."""
    taken = {gpu.index: gpu for gpu in take(as_seen_by(spec, gpus), spec.request(), chosen)}
    guaranteed = guaranteed_compute(spec)
    return tuple(
        replace(
            gpu,
            compute_free=gpu.compute_free - guaranteed,
            memory_free=max(0, taken[gpu.index].memory_free - reserve),
        )
        if gpu.index in chosen
        else gpu
        for gpu in gpus
    )


def _spread(jobs: Sequence[Job]) -> dict[str, set[int]]:
    """The GPUs each spread group's jobs hold."""
    groups: dict[str, set[int]] = {}
    for job in jobs:
        if job.spec.spread_group:
            groups.setdefault(job.spec.spread_group, set()).update(job.gpus)
    return groups


def _mps_servers(jobs: Sequence[Job]) -> dict[int, int]:
    """The uid each GPU's MPS server serves: the owner of its running MPS jobs."""
    return {job.gpus[0]: job.uid for job in jobs if job.spec.mode is Mode.MPS and job.gpus}


def _others_servers(job: Job, servers: dict[int, int]) -> dict[int, int]:
    """The GPUs `job` cannot use for the MPS server another user has there (none unless MPS)."""
    if job.spec.mode is not Mode.MPS:
        return {}
    return {gpu: uid for gpu, uid in servers.items() if uid != job.uid}


#: the policy a spread group's jobs (a service's replicas) place with: binpack fills the most used
#: GPU that fits, so services pack onto as few GPUs as their shares allow, whatever policy the
#: node's batch jobs place with
REPLICA_POLICY = "binpack"


def plan(
    queued: Sequence[Job],
    running: Sequence[Job],
    now: Sequence[GpuView],
    capacity: Sequence[GpuView],
    policy: str,
    target: TargetWorkload | None = None,
    reserve: int = 0,
) -> Plan:
    """Start what may start on `now` (free room) in queue order; `capacity` is the idle node,
    `running` the jobs on it, `reserve` the context reserve per job and GPU."""
    by_index = {gpu.index: gpu for gpu in capacity}
    views = tuple(now)
    blocked: list[Job] = []
    taken = _taken_by(running, reserve)
    starts: list[Start] = []
    waiting: dict[int, tuple[str, ...]] = {}
    groups = _spread(running)
    servers = _mps_servers(running)
    for job in queued:
        request = job.spec.request()
        avoid = groups.get(job.spec.spread_group, set()) if job.spec.spread_group else set()
        others = _others_servers(job, servers)
        seen = tuple(gpu for gpu in as_seen_by(job.spec, views) if gpu.index not in others)
        # the spread is a preference: where it would delay a blocked job, packed may not
        for avoiding in (avoid, set()) if avoid else (avoid,):
            how = REPLICA_POLICY if job.spec.spread_group else policy
            result = place(request, seen, how, target, avoiding)
            if result.gpus is None:
                break
            delayed = [_delays(blocked, by_index[g], job.spec, taken, reserve) for g in result.gpus]
            victim = next((d for d in delayed if d is not None), None)
            if victim is None:
                break
        if result.gpus is None:
            served = tuple(
                f"GPU {gpu}'s MPS server serves uid {uid} until their MPS jobs there end"
                for gpu, uid in sorted(others.items())
            )
            lacks = tuple(str(lack) for lack in result.why_not)
            # where every GPU's server is another user's, those servers are the whole reason
            waiting[job.id] = served if served and not seen else served + lacks
            blocked.append(job)
            continue
        if victim is not None:
            waiting[job.id] = (f"it fits now, but would delay job {victim} queued ahead of it",)
            blocked.append(job)
            continue
        memory = tuple(share_on(job.spec, by_index[g], reserve) for g in result.gpus)
        compute = guaranteed_compute(job.spec)
        taken.extend(
            _Taken(g, math.inf, queue_order(job), compute, held(job.spec, m, reserve))
            for g, m in zip(result.gpus, memory, strict=True)
        )
        views = _after(views, job.spec, result.gpus, reserve)
        if job.spec.spread_group:
            groups.setdefault(job.spec.spread_group, set()).update(result.gpus)
        if job.spec.mode is Mode.MPS:
            servers.setdefault(result.gpus[0], job.uid)
        starts.append(Start(job, result.gpus, memory, backfill=bool(blocked)))
    return Plan(tuple(starts), waiting)
