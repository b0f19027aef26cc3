"""FGD's target workload M: the popular pod specs of a workload and their frequencies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.demand import Demand, demand_of
from gpupool.scheduler.gpus import GpuRequest

#: FGD keeps the most popular specs until they cover this share of the pods
DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True)
class PodSpec:
    """One spec of the target workload. GPU memory per GPU, as a Demand asks it (bytes, a share
    of the GPU's memory, or in proportion to compute), counts for live shares; the trace's pods
    ask none (FGD ignores memory)."""

    cpu: int
    gpu_milli: int
    gpus: int
    gpu_models: tuple[str, ...]
    memory: int = 0
    memory_share: float = 0.0
    proportional: bool = False

    @property
    def asks_memory(self) -> bool:
        return self.gpus > 0 and (self.proportional or self.memory > 0 or self.memory_share > 0)

    @property
    def is_share(self) -> bool:
        """Part of one GPU: what the packing prices value (scheduler/packing.py)."""
        return self.gpus == 1 and 0 < self.gpu_milli < MILLI_PER_GPU


def spec_of(request: Request | GpuRequest | Demand) -> PodSpec:
    """The spec of a request; a whole-GPU or CPU-only request has gpu_milli 1000 / 0."""
    demand = demand_of(request)
    if demand.gpus == 0:
        return PodSpec(demand.cpu, 0, 0, demand.gpu_models)
    return PodSpec(
        demand.cpu,
        demand.compute,
        demand.gpus,
        demand.gpu_models,
        demand.memory,
        demand.memory_share,
        demand.proportional,
    )


@dataclass(frozen=True)
class WideSize:
    """One CPU size of a workload's widest pods: the CPU (milli) they ask, the most host memory
    (bytes) any of that size asks, and the share of all pods that are this wide and ask at least
    this much CPU (they all need a node with this much free)."""

    cpu: int
    host_memory: int
    share: float


@dataclass(frozen=True)
class Widest:
    """The widest pods of a workload: their GPU count, the most CPU (milli) and host memory
    (bytes) any of them asks, and their CPU sizes (largest first; none below 2 GPUs)."""

    gpus: int = 0
    cpu: int = 0
    host_memory: int = 0
    sizes: tuple[WideSize, ...] = ()

    @classmethod
    def of(cls, demands: Sequence[Demand]) -> Widest:
        gpus = max((d.gpus for d in demands), default=0)
        wide = [d for d in demands if d.gpus == gpus]
        return cls(
            gpus,
            max((d.cpu for d in wide), default=0),
            max((d.host_memory for d in wide), default=0),
            wide_sizes([(d.cpu, d.host_memory, 1.0) for d in wide], len(demands))
            if gpus > 1
            else (),
        )


def wide_sizes(pods: Sequence[tuple[int, int, float]], total: float) -> tuple[WideSize, ...]:
    """The sizes of the widest pods, given each as (CPU, host memory, weight) out of `total`
    weight for the whole workload: largest CPU first, each with the weight at or above it."""
    sizes: list[WideSize] = []
    for cpu in sorted({pod[0] for pod in pods}, reverse=True):
        memory = max(pod[1] for pod in pods if pod[0] == cpu)
        weight = sum(pod[2] for pod in pods if pod[0] >= cpu)
        sizes.append(WideSize(cpu, memory, weight / total if total else 0.0))
    return tuple(sizes)


@dataclass(frozen=True, eq=False)
class TargetWorkload:
    """Specs and their probabilities p_m (summing to 1); hashed by identity, as a cache key.

    `cpu_per_gpu_milli` and `memory_per_gpu_milli` are the whole workload's CPU (milli) and host
    memory (bytes) asked per GPU milli asked, CPU-only pods included; the `gpupool` policy uses
    them to see GPUs that a node's CPU or memory can no longer feed (0: not known).
    """

    specs: tuple[PodSpec, ...]
    probabilities: tuple[float, ...]
    cpu_per_gpu_milli: float = 0.0
    memory_per_gpu_milli: float = 0.0
    #: the widest pod of the workload (most GPUs; the most CPU and host memory any of the pods
    #: that wide asks), rare pods included: `gpupool` keeps a few idle nodes able to take it
    widest: Widest = field(default_factory=lambda: Widest())
    #: GPU milli asked per pod, CPU-only pods included (0: not known): with the widest pods'
    #: shares, how many of them the free GPUs are expected to meet
    gpu_milli_per_pod: float = 0.0

    def __post_init__(self) -> None:
        if len(self.specs) != len(self.probabilities):
            raise InvalidRequest("invalid target workload: specs and probabilities differ")

    @classmethod
    def from_requests(
        cls, requests: Sequence[Request | GpuRequest | Demand], coverage: float = DEFAULT_COVERAGE
    ) -> TargetWorkload:
        """Group `requests` by spec, keep the most popular until they cover `coverage` of them,
        and renormalise (ties in popularity are ordered by spec, so the result is stable)."""
        if not 0 < coverage <= 1:
            raise InvalidRequest(f"invalid coverage {coverage!r}: must be in (0, 1]")
        demands = [demand_of(r) for r in requests]
        counts = Counter(spec_of(r) for r in demands)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], _spec_key(item[0])))
        kept: list[tuple[PodSpec, int]] = []
        covered = 0
        for spec, count in ranked:
            if covered >= coverage * len(requests):
                break
            kept.append((spec, count))
            covered += count
        total = sum(count for _, count in kept)
        gpu_milli = sum(r.total_gpu_milli for r in demands)
        return cls(
            specs=tuple(spec for spec, _ in kept),
            probabilities=tuple(count / total for _, count in kept),
            cpu_per_gpu_milli=sum(r.cpu for r in demands) / gpu_milli if gpu_milli else 0.0,
            memory_per_gpu_milli=(
                sum(r.host_memory for r in demands) / gpu_milli if gpu_milli else 0.0
            ),
            widest=Widest.of(demands),
            gpu_milli_per_pod=gpu_milli / len(demands) if demands else 0.0,
        )


def _spec_key(spec: PodSpec) -> tuple[int, int, int, str, int, float, bool]:
    models = "|".join(spec.gpu_models)
    return (
        spec.gpus,
        spec.gpu_milli,
        spec.cpu,
        models,
        spec.memory,
        spec.memory_share,
        spec.proportional,
    )


#: the live target workload before any share was submitted: a quarter, a half and a whole GPU,
#: memory in proportion to compute, equally likely
PRIOR = TargetWorkload(
    specs=tuple(PodSpec(0, milli, 1, (), proportional=True) for milli in (250, 500, 1000)),
    probabilities=(1 / 3, 1 / 3, 1 / 3),
)
