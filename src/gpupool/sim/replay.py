"""Replay pods in arrival order through one policy; record allocation and fragment per event."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.resources import NodeSpec, Request
from gpupool.scheduler import (
    ClusterState,
    Demand,
    TargetWorkload,
    demand_of,
    fragment_index,
    make_policy,
    place,
)


@dataclass(frozen=True)
class ReplayResult:
    """Per pod event i (after pod i was placed or dropped): cumulative requested GPU milli
    (failed pods included), allocated milli, FGD fragment milli of the target workload, idle
    (free) GPU milli, and whether pod i was placed."""

    policy: str
    seed: int
    arrived_milli: npt.NDArray[np.int64]
    allocated_milli: npt.NDArray[np.int64]
    fragment_milli: npt.NDArray[np.float64]
    idle_milli: npt.NDArray[np.int64]
    placed: npt.NDArray[np.bool_]
    seconds: float
    total_gpu_milli: int

    @property
    def failed_pods(self) -> int:
        return int(np.count_nonzero(~self.placed))


def replay(
    nodes: Sequence[NodeSpec],
    pods: Sequence[Request],
    policy_name: str,
    seed: int,
    target_workload: TargetWorkload,
    *,
    fragment_curve: bool = True,
) -> ReplayResult:
    """Place `pods` one at a time in the given order (never retried, never moved). Without
    `fragment_curve` the fragment after each pod is not kept (NaN): a policy that does not
    score by it then pays nothing for it."""
    started = time.perf_counter()
    policy = make_policy(policy_name, seed=seed, target_workload=target_workload)
    state = ClusterState(nodes)
    fragments = fragment_index(state, target_workload) if fragment_curve else None
    count = len(pods)
    requested = np.fromiter((p.total_gpu_milli for p in pods), np.int64, count)
    allocated = np.zeros(count, np.int64)
    fragment = np.zeros(count, np.float64)
    placed = np.zeros(count, np.bool_)
    in_use = 0
    # pods repeat a few shapes: one Demand per shape, so its cached keys are made once
    demands: dict[tuple[object, ...], Demand] = {}
    for i, pod in enumerate(pods):
        key = (pod.gpus, pod.compute, pod.cpu, pod.host_memory, pod.gpu_models, pod.memory)
        demand = demands.get(key)
        if demand is None:
            demand = demands[key] = demand_of(pod)
        placement = place(state, demand, policy)
        if placement is not None:
            state.allocate(demand, placement)
            in_use += pod.total_gpu_milli
            placed[i] = True
        allocated[i] = in_use
        fragment[i] = fragments.total if fragments is not None else np.nan
    return ReplayResult(
        policy=policy_name,
        seed=seed,
        arrived_milli=np.cumsum(requested),
        allocated_milli=allocated,
        fragment_milli=fragment,
        idle_milli=state.total_gpu_milli - allocated,
        placed=placed,
        seconds=time.perf_counter() - started,
        total_gpu_milli=state.total_gpu_milli,
    )
