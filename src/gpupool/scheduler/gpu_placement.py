"""Live placement on one node's GPUs: fits or not, why not, never, which GPUs, and a node score.

The API (stable: the node daemon and the Kubernetes scheduler extender build on it):

- `never_fits(request, gpus) -> str | None`: why `request` can never fit this node whatever
  else runs on it (more GPUs than it has, a model it lacks, a share larger than any allowed
  GPU); None when it could. `check_possible` raises `Unschedulable` with that line.
- `shortfalls(request, gpus) -> tuple[Shortfall, ...]`: for each GPU that cannot take the share
  now, what it lacks (`model`, `health`, `compute` milli, `memory` bytes), needed against free.
- `place(request, gpus, policy, target=()) -> GpuPlacement`: the chosen GPU indices (None when
  the share does not fit now), the shortfalls when it does not, and the node's score.
- `node_score(request, gpus, policy, target=()) -> float | None`: 0..100, higher is better,
  None when the share does not fit now; comparable between nodes for one request and policy,
  so an extender can rank nodes with it.

Policies (`GPU_POLICIES`), the GPU-level forms of those the trace simulator measures:
- `binpack` (default): the fullest GPUs that fit (least free compute, then memory, then index);
  the node score is how full the node is after the placement, so full nodes fill first.
- `spread`: the emptiest GPUs that fit; the node score is how empty the node stays.
- `gpupool`: fragmentation-aware, FGD at GPU level with memory and models. For a target
  workload M of shapes with weights p_m, the fragment of a node is
  F = sum_m p_m * (free compute of the healthy GPUs that cannot hold shape m), counting every
  healthy GPU when fewer than m's GPU count can; a GPU "holds" m when its model is allowed and
  both m's compute and m's memory fit. GPUs are taken one at a time, each the one whose use
  grows F least (ties go as binpack); the node score is 50 + 50 * (F before - F after) /
  (compute taken), clipped to 0..100. M is the caller's (the daemon passes the shapes of its
  queued and running jobs), else `DEFAULT_TARGET`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidRequest, Unschedulable
from gpupool.core.units import MILLI_PER_GPU, format_bytes
from gpupool.scheduler.gpus import GpuRequest, GpuView, take

GPU_POLICIES: tuple[str, ...] = ("binpack", "spread", "gpupool")
DEFAULT_GPU_POLICY = "binpack"

#: the target workload of `gpupool` when the caller has none: a quarter, a half, a whole GPU
DEFAULT_TARGET: tuple[tuple[GpuRequest, float], ...] = (
    (GpuRequest(1, 250), 1 / 3),
    (GpuRequest(1, 500), 1 / 3),
    (GpuRequest(1, MILLI_PER_GPU), 1 / 3),
)

Target = Sequence[tuple[GpuRequest, float]]


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
    """The answer of `place`: GPU indices or None, why not, and the node score (None: no fit)."""

    gpus: tuple[int, ...] | None
    why_not: tuple[Shortfall, ...] = ()
    score: float | None = None

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


def _fullness(gpu: GpuView) -> float:
    compute = 1 - gpu.compute_free / MILLI_PER_GPU
    memory = 1 - gpu.memory_free / gpu.memory_total if gpu.memory_total else 1.0
    return (compute + memory) / 2


def _node_fullness(gpus: Sequence[GpuView]) -> float:
    return sum(_fullness(gpu) for gpu in gpus) / len(gpus) if gpus else 0.0


def _binpack_key(gpu: GpuView) -> tuple[int, int, int]:
    return (gpu.compute_free, gpu.memory_free, gpu.index)


def _spread_key(gpu: GpuView) -> tuple[int, int, int]:
    return (-gpu.compute_free, -gpu.memory_free, gpu.index)


def fragment(gpus: Sequence[GpuView], target: Target) -> float:
    """F of the node for `target` (see the module docstring), in milli."""
    total = 0.0
    for shape, weight in target:
        holds = [not gpu_shortfalls(shape, gpu) for gpu in gpus]
        if sum(holds) < shape.gpus:
            lost = sum(gpu.compute_free for gpu in gpus if gpu.healthy)
        else:
            # a GPU that is not healthy is no fragment: no shape can use it, held or not
            lost = sum(
                gpu.compute_free
                for gpu, ok in zip(gpus, holds, strict=True)
                if gpu.healthy and not ok
            )
        total += weight * lost
    return total


def _choose_gpupool(
    request: GpuRequest, gpus: Sequence[GpuView], target: Target
) -> tuple[int, ...]:
    chosen: list[int] = []
    now = tuple(gpus)
    for _ in range(request.gpus):
        candidates = [gpu for gpu in fitting(request, now) if gpu.index not in chosen]
        best = min(
            candidates,
            key=lambda gpu: (fragment(take(now, request, [gpu.index]), target), _binpack_key(gpu)),
        )
        chosen.append(best.index)
        now = take(now, request, [best.index])
    return tuple(sorted(chosen))


def _resolve(policy: str) -> str:
    if policy not in GPU_POLICIES:
        raise InvalidRequest(
            f"unknown GPU policy {policy!r}; valid policies: {', '.join(GPU_POLICIES)}"
        )
    return policy


def _choose(
    request: GpuRequest, gpus: Sequence[GpuView], policy: str, target: Target
) -> tuple[int, ...]:
    if policy == "gpupool":
        return _choose_gpupool(request, gpus, target)
    key: Callable[[GpuView], tuple[int, int, int]] = (
        _binpack_key if policy == "binpack" else _spread_key
    )
    ordered = sorted(fitting(request, gpus), key=key)
    return tuple(sorted(gpu.index for gpu in ordered[: request.gpus]))


def _score(
    request: GpuRequest,
    gpus: Sequence[GpuView],
    chosen: tuple[int, ...],
    policy: str,
    target: Target,
) -> float:
    after = take(gpus, request, chosen)
    if policy == "binpack":
        return round(100 * _node_fullness(after), 6)
    if policy == "spread":
        return round(100 * (1 - _node_fullness(after)), 6)
    delta = fragment(gpus, target) - fragment(after, target)
    raw = 50 + 50 * delta / (request.compute * request.gpus)
    return round(min(100.0, max(0.0, raw)), 6)


def place(
    request: GpuRequest,
    gpus: Sequence[GpuView],
    policy: str = DEFAULT_GPU_POLICY,
    target: Target = (),
) -> GpuPlacement:
    """Where `request` goes on `gpus` now under `policy`, or why it does not fit now.

    It does not check `never_fits`: a share that can never fit also does not fit now, and its
    shortfalls say so GPU by GPU; callers refuse it at submit with `check_possible`.
    """
    policy = _resolve(policy)
    shapes = target if target else DEFAULT_TARGET
    if len(fitting(request, gpus)) < request.gpus:
        return GpuPlacement(None, shortfalls(request, gpus))
    chosen = _choose(request, gpus, policy, shapes)
    return GpuPlacement(chosen, (), _score(request, gpus, chosen, policy, shapes))


def node_score(
    request: GpuRequest,
    gpus: Sequence[GpuView],
    policy: str = DEFAULT_GPU_POLICY,
    target: Target = (),
) -> float | None:
    """0..100 (higher is better) for placing `request` on this node; None if it does not fit."""
    return place(request, gpus, policy, target).score
