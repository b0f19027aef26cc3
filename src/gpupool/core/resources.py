"""Resource and request types shared by every layer: what a workload asks for, what a node has."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU


class Priority(StrEnum):
    """`high` shares are guaranteed; `low` ones are opportunistic and yield to `high`."""

    HIGH = "high"
    LOW = "low"


class Mode(StrEnum):
    """How a share holds on the GPU (docs/usage.md, `gpupool serve`; docs/modes.md)."""

    SHIM = "shim"
    MPS = "mps"
    MIG = "mig"
    EXCLUSIVE = "exclusive"


def _check_count(name: str, value: int, *, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"invalid {name} {value!r}: must be an integer")
    if value < minimum:
        raise InvalidRequest(f"invalid {name} {value}: must be at least {minimum}")


def _check_quantity(name: str, value: float) -> None:
    if isinstance(value, float) and math.isnan(value):
        raise InvalidRequest(f"invalid {name} {value!r}: not a number")
    if value < 0:
        raise InvalidRequest(f"invalid {name} {value!r}: must not be negative")


@dataclass(frozen=True)
class Request:
    """A share: `gpus` GPUs with `compute` milli-GPU and `memory` bytes on each.

    `compute` is per GPU: 1000 is a whole GPU; a fractional share (below 1000) only exists
    with `gpus == 1`. `memory` None means "no memory limit beyond what the GPU has".
    """

    gpus: int = 0
    compute: int = MILLI_PER_GPU
    memory: int | None = None
    cpu: int = 0
    host_memory: int = 0
    gpu_models: tuple[str, ...] = ()
    priority: Priority = Priority.HIGH
    mode: Mode = Mode.SHIM
    mig_profile: str | None = None
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        _check_count("GPU count", self.gpus)
        _check_count("CPU", self.cpu)
        _check_count("host memory", self.host_memory)
        if self.memory is not None:
            _check_count("GPU memory", self.memory)
        _check_quantity("compute", self.compute)
        if not isinstance(self.compute, int) or isinstance(self.compute, bool):
            raise InvalidRequest(f"invalid compute {self.compute!r}: must be milli-GPU (integer)")
        if self.gpus > 0 and not 0 < self.compute <= MILLI_PER_GPU:
            raise InvalidRequest(
                f"invalid compute {self.compute}: must be 1..{MILLI_PER_GPU} milli-GPU per GPU"
            )
        if self.gpus > 1 and self.compute < MILLI_PER_GPU:
            raise InvalidRequest(
                f"invalid request: a fractional share ({self.compute} milli) needs exactly one GPU"
            )
        if self.mode is Mode.EXCLUSIVE and self.compute < MILLI_PER_GPU:
            raise InvalidRequest("invalid request: mode exclusive takes whole GPUs")
        if self.mig_profile is not None and self.mode is not Mode.MIG:
            raise InvalidRequest("invalid request: a MIG profile needs mode mig")

    @property
    def is_fractional(self) -> bool:
        """One GPU, less than all of it."""
        return self.gpus == 1 and self.compute < MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        """GPU milli asked for over all GPUs (0 for a CPU-only request)."""
        return self.gpus * self.compute if self.gpus else 0

    def allows_model(self, model: str) -> bool:
        """True when `model` is one of `gpu_models`, or when any model will do."""
        return not self.gpu_models or model in self.gpu_models


@dataclass(frozen=True)
class NodeSpec:
    """A node: CPU in milli-cores, host memory in bytes, `gpu_count` GPUs of one model."""

    name: str
    cpu: int
    host_memory: int
    gpu_count: int
    gpu_model: str = ""
    gpu_memory: int | None = None

    def __post_init__(self) -> None:
        _check_count("node CPU", self.cpu)
        _check_count("node host memory", self.host_memory)
        _check_count("node GPU count", self.gpu_count)
