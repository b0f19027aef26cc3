"""FGD's target workload M: the popular pod specs of a workload and their frequencies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.core.units import MILLI_PER_GPU

#: FGD keeps the most popular specs until they cover this share of the pods
DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True)
class PodSpec:
    """One spec of the target workload (memory is ignored, as FGD does)."""

    cpu: int
    gpu_milli: int
    gpus: int
    gpu_models: tuple[str, ...]


def spec_of(request: Request) -> PodSpec:
    """The spec of a request; a whole-GPU or CPU-only request has gpu_milli 1000 / 0."""
    if request.gpus == 0:
        return PodSpec(request.cpu, 0, 0, request.gpu_models)
    milli = request.compute if request.is_fractional else MILLI_PER_GPU
    return PodSpec(request.cpu, milli, request.gpus, request.gpu_models)


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

    def __post_init__(self) -> None:
        if len(self.specs) != len(self.probabilities):
            raise InvalidRequest("invalid target workload: specs and probabilities differ")

    @classmethod
    def from_requests(
        cls, requests: Sequence[Request], coverage: float = DEFAULT_COVERAGE
    ) -> TargetWorkload:
        """Group `requests` by spec, keep the most popular until they cover `coverage` of them,
        and renormalise (ties in popularity are ordered by spec, so the result is stable)."""
        if not 0 < coverage <= 1:
            raise InvalidRequest(f"invalid coverage {coverage!r}: must be in (0, 1]")
        counts = Counter(spec_of(r) for r in requests)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], _spec_key(item[0])))
        kept: list[tuple[PodSpec, int]] = []
        covered = 0
        for spec, count in ranked:
            if covered >= coverage * len(requests):
                break
            kept.append((spec, count))
            covered += count
        total = sum(count for _, count in kept)
        gpu_milli = sum(r.total_gpu_milli for r in requests)
        return cls(
            specs=tuple(spec for spec, _ in kept),
            probabilities=tuple(count / total for _, count in kept),
            cpu_per_gpu_milli=sum(r.cpu for r in requests) / gpu_milli if gpu_milli else 0.0,
            memory_per_gpu_milli=(
                sum(r.host_memory for r in requests) / gpu_milli if gpu_milli else 0.0
            ),
        )


def _spec_key(spec: PodSpec) -> tuple[int, int, int, str]:
    return (spec.gpus, spec.gpu_milli, spec.cpu, "|".join(spec.gpu_models))
