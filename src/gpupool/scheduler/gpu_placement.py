"""Live placement on one node's GPUs: fits or not, why not, never, and which GPUs.

The choice itself is the engine's: `place` builds the node as a one-row `ClusterState`
(scheduler/state.py) and asks the policy from the one registry (scheduler/registry.py), the
same objects the trace replay measures and the Kubernetes extender ranks nodes with. What is
here besides is explanation, for users: why a share does not fit now (`shortfalls`) or never
could (`never_fits`).

- `never_fits(request, gpus) -> str | None`: why `request` can never fit this node whatever
  else runs on it (more GPUs than it has, a model it lacks, a share larger than any allowed
  GPU); None when it could. `check_possible` raises `Unschedulable` with that line.
- `shortfalls(request, gpus) -> tuple[Shortfall, ...]`: for each GPU that cannot take the share
  now, what it lacks (`model`, `health`, `compute` milli, `memory` bytes), needed against free.
- `place(request, gpus, policy, target, avoid) -> GpuPlacement`: the chosen GPU indices (None
  when the share does not fit now) and the shortfalls when it does not. `target` is the target
  workload the fragmentation-aware policies score against (default: the built-in prior).
  `avoid` is the spread preference (replicas of one service): GPU indices the share should not
  take; the policy chooses among the other GPUs, and among all of them only when the share fits
  on none of the others. A preference only: it never makes a share that fits not fit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.errors import Unschedulable
from gpupool.core.resources import NodeSpec
from gpupool.core.units import format_bytes
from gpupool.scheduler.demand import demand_of
from gpupool.scheduler.gpus import GpuRequest, GpuView
from gpupool.scheduler.registry import DEFAULT_POLICY, make_policy
from gpupool.scheduler.state import ClusterState, GpuSlots
from gpupool.scheduler.workload import PRIOR, TargetWorkload


@dataclass(frozen=True)
class Shortfall:
    """What one GPU lacks for a share now: `what` is model, health, compute or memory; or, with
    `gpu` -1 and `what` "gpus", the node lacks enough GPUs that can take the share."""

    gpu: int
    what: str
    need: int | str
    free: int | str

    def __str__(self) -> str:
        if self.what == "model":
            return f"GPU {self.gpu}: model {self.free} is not one of {self.need}"
        if self.what == "gpus":
            plural = "" if self.need == 1 else "s"
            return f"{self.need} GPU{plural} needed, {self.free} can take the share now"
        if self.what == "health":
            return f"GPU {self.gpu}: not healthy"
        if self.what == "memory":
            assert isinstance(self.need, int) and isinstance(self.free, int)
            need, free = format_bytes(self.need), format_bytes(self.free)
            return f"GPU {self.gpu}: memory {need} needed, {free} free"
        # stored in milli-GPU, shown in the percent users ask for
        assert isinstance(self.need, int) and isinstance(self.free, int)
        return f"GPU {self.gpu}: compute {self.need / 10:g}% needed, {self.free / 10:g}% free"


@dataclass(frozen=True)
class GpuPlacement:
    """The answer of `place`: GPU indices or None, and why not."""

    gpus: tuple[int, ...] | None
    why_not: tuple[Shortfall, ...] = ()

    @property
    def fits(self) -> bool:
        return self.gpus is not None


def never_fits(request: GpuRequest, gpus: Sequence[GpuView]) -> str | None:
    """Why `request` can never fit on `gpus` even with nothing else running; None if it can."""
    if request.gpus > len(gpus):
        return f"it asks for {request.gpus} GPUs and this node has {len(gpus)}"
    allowed = [gpu for gpu in gpus if request.allows(gpu)]
    if len(allowed) < request.gpus:
        models = ", ".join(sorted({gpu.model for gpu in gpus})) or "none"
        wanted = ", ".join(request.gpu_models)
        return f"it asks for {request.gpus} GPUs of model {wanted}; this node has {models}"
    roomy = [gpu for gpu in allowed if request.memory_on(gpu) <= gpu.memory_total]
    if len(roomy) < request.gpus:
        largest = max(gpu.memory_total for gpu in allowed)
        need = format_bytes(request.memory_on(allowed[0]))
        return (
            f"it asks for {need} per GPU and the largest GPU it may use has {format_bytes(largest)}"
        )
    return None


def check_possible(request: GpuRequest, gpus: Sequence[GpuView]) -> None:
    """Unschedulable, saying why, when `request` can never fit on `gpus`."""
    reason = never_fits(request, gpus)
    if reason is not None:
        raise Unschedulable(f"the share can never fit this node: {reason}")


def gpu_shortfalls(request: GpuRequest, gpu: GpuView) -> tuple[Shortfall, ...]:
    """What `gpu` lacks for one GPU of `request` now (empty: it fits)."""
    if not request.allows(gpu):
        return (Shortfall(gpu.index, "model", ", ".join(request.gpu_models), gpu.model),)
    if not gpu.healthy:
        return (Shortfall(gpu.index, "health", "healthy", "unhealthy"),)
    lacks: list[Shortfall] = []
    if gpu.compute_free < request.compute:
        lacks.append(Shortfall(gpu.index, "compute", request.compute, gpu.compute_free))
    memory = request.memory_on(gpu)
    if gpu.memory_free < memory:
        lacks.append(Shortfall(gpu.index, "memory", memory, gpu.memory_free))
    return tuple(lacks)


def shortfalls(request: GpuRequest, gpus: Sequence[GpuView]) -> tuple[Shortfall, ...]:
    """Every GPU's shortfalls for `request`, in GPU order, then the node's when too few GPUs can
    take the share (empty: it fits now)."""
    lacks = [lack for gpu in gpus for lack in gpu_shortfalls(request, gpu)]
    able = len(fitting(request, gpus))
    if able < request.gpus:
        lacks.append(Shortfall(-1, "gpus", request.gpus, able))
    return tuple(lacks)


def fitting(request: GpuRequest, gpus: Sequence[GpuView]) -> list[GpuView]:
    """The GPUs that can take one GPU of `request` now."""
    return [gpu for gpu in gpus if not gpu_shortfalls(request, gpu)]


def node_state(gpus: Sequence[GpuView]) -> ClusterState:
    """The node as the engine's state: one row, one slot per GPU of `gpus`, in their order."""
    names = tuple(sorted({gpu.model for gpu in gpus}))
    ids = {name: i for i, name in enumerate(names)}
    slots = GpuSlots(
        np.array([[ids[gpu.model] for gpu in gpus]], np.int64).reshape(1, len(gpus)),
        np.array([[gpu.memory_total for gpu in gpus]], np.int64).reshape(1, len(gpus)),
        np.array([[gpu.healthy for gpu in gpus]], np.bool_).reshape(1, len(gpus)),
        names,
    )
    state = ClusterState.of_gpus([NodeSpec("node", 0, 0, len(gpus))], slots)
    compute = np.array([gpu.compute_free for gpu in gpus], np.int64)
    memory = np.array([gpu.memory_free for gpu in gpus], np.int64)
    state.set_free(0, compute, memory, state.class_pods[0])
    return state


def place(
    request: GpuRequest,
    gpus: Sequence[GpuView],
    policy: str = DEFAULT_POLICY,
    target: TargetWorkload | None = None,
    avoid: Collection[int] = (),
) -> GpuPlacement:
    """Where `request` goes on `gpus` now under `policy`, or why it does not fit now; off the
    GPUs in `avoid` when it fits elsewhere.

    It does not check `never_fits`: a share that can never fit also does not fit now, and its
    shortfalls say so GPU by GPU; callers refuse it at submit with `check_possible`.
    """
    others = [gpu for gpu in gpus if gpu.index not in avoid]
    if 0 < len(others) < len(gpus):
        spread = place(request, others, policy, target)
        if spread.fits:
            return spread
    if not gpus:  # every GPU of the node set aside (MIG mode, another user's MPS server)
        return GpuPlacement(None, shortfalls(request, gpus))
    chooser = make_policy(policy, seed=0, target_workload=target or PRIOR)
    demand = demand_of(request)
    state = node_state(gpus)
    if not state.feasible(demand)[0]:
        return GpuPlacement(None, shortfalls(request, gpus))
    chosen = chooser.choose(state, demand, np.zeros(1, np.int64))
    # the state's observers (a fragment index) refer back to it: without this the decision's
    # arrays would wait for the cyclic collector, whose passes made the daemon's slowest
    # decisions (docs/benchmarks/placement-latency.md)
    state.drop_observers()
    return GpuPlacement(tuple(sorted(gpus[slot].index for slot in chosen.gpus)))
