"""One node's GPUs as the live placement sees them, and a request for a share of them.

The trace simulator's `ClusterState` knows compute only, one model per node; a live node needs
more: each GPU has its own model, memory capacity and health, and a share asks for memory as well
as compute on each of its GPUs. These are plain immutable values: the caller (the node daemon,
the Kubernetes extender) builds a `GpuView` per GPU from a device snapshot minus what it has
admitted, and asks `gpu_placement` where a `GpuRequest` goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU, MemoryShare


@dataclass(frozen=True)
class GpuView:
    """One GPU: what it is (index, model, memory) and what is still free on it.

    `memory_free` and `compute_free` are what admission has not promised yet, not what the
    driver reports in use: a share owns its memory from the moment it is admitted.
    """

    index: int
    model: str
    memory_total: int
    memory_free: int
    compute_free: int = MILLI_PER_GPU
    healthy: bool = True

    def __post_init__(self) -> None:
        if self.memory_total < 0 or not 0 <= self.memory_free <= self.memory_total:
            raise InvalidRequest(
                f"invalid GPU {self.index}: free memory {self.memory_free} outside "
                f"0..{self.memory_total}"
            )
        if not 0 <= self.compute_free <= MILLI_PER_GPU:
            raise InvalidRequest(
                f"invalid GPU {self.index}: free compute {self.compute_free} outside "
                f"0..{MILLI_PER_GPU}"
            )

    @classmethod
    def idle(cls, index: int, model: str, memory_total: int, healthy: bool = True) -> GpuView:
        """A GPU with nothing admitted on it."""
        return cls(index, model, memory_total, memory_total, MILLI_PER_GPU, healthy)


@dataclass(frozen=True)
class GpuRequest:
    """A share: `gpus` GPUs of one node with `compute` milli and `memory` on each.

    `memory` is bytes, a `MemoryShare` (bytes or a fraction of each GPU's own memory), or None:
    the same fraction of the GPU's memory as `compute` is of its compute. `gpu_models` (empty:
    any) constrains every GPU of the share. A whole GPU for one share alone (mode `exclusive`)
    is `compute=1000, memory=MemoryShare(fraction=1.0)`: see `exclusive()`.
    """

    gpus: int = 1
    compute: int = MILLI_PER_GPU
    memory: int | MemoryShare | None = None
    gpu_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise InvalidRequest(f"invalid GPU count {self.gpus!r}: must be at least 1")
        if isinstance(self.compute, bool) or not isinstance(self.compute, int):
            raise InvalidRequest(f"invalid compute {self.compute!r}: must be milli-GPU")
        if not 0 < self.compute <= MILLI_PER_GPU:
            raise InvalidRequest(
                f"invalid compute {self.compute}: must be 1..{MILLI_PER_GPU} milli-GPU per GPU"
            )
        if isinstance(self.memory, int) and self.memory <= 0:
            raise InvalidRequest(f"invalid memory {self.memory}: must be positive")

    @classmethod
    def exclusive(cls, gpus: int = 1, gpu_models: Sequence[str] = ()) -> GpuRequest:
        """Whole GPUs: all of their compute and memory."""
        return cls(gpus, MILLI_PER_GPU, MemoryShare(fraction=1.0), tuple(gpu_models))

    def memory_on(self, gpu: GpuView) -> int:
        """Bytes this share takes on `gpu` (a fraction resolves against that GPU's memory)."""
        if self.memory is None:
            return gpu.memory_total * self.compute // MILLI_PER_GPU
        if isinstance(self.memory, int):
            return self.memory
        return self.memory.resolve(gpu.memory_total)

    def allows(self, gpu: GpuView) -> bool:
        """True when `gpu`'s model is allowed (any model when `gpu_models` is empty)."""
        return not self.gpu_models or gpu.model in self.gpu_models


def take(
    gpus: Sequence[GpuView], request: GpuRequest, chosen: Sequence[int]
) -> tuple[GpuView, ...]:
    """`gpus` after `request` took its share on the GPU indices `chosen`.

    InvalidRequest (nothing changed) if a chosen GPU is absent or lacks room: callers that place
    several shares in one pass (a queue) use this to see the node as each placement leaves it.
    """
    by_index = {gpu.index: gpu for gpu in gpus}
    if len(set(chosen)) != len(chosen) or any(i not in by_index for i in chosen):
        raise InvalidRequest(f"invalid placement {list(chosen)}: unknown or repeated GPU")
    updated = dict(by_index)
    for i in chosen:
        gpu = by_index[i]
        memory = request.memory_on(gpu)
        if gpu.compute_free < request.compute or gpu.memory_free < memory:
            raise InvalidRequest(f"invalid placement: GPU {i} lacks room for the share")
        updated[i] = replace(
            gpu,
            compute_free=gpu.compute_free - request.compute,
            memory_free=gpu.memory_free - memory,
        )
    return tuple(updated[gpu.index] for gpu in gpus)
