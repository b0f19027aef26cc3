"""What one placement asks of a node, in the engine's terms, from a trace pod or a live share.

The trace's `Request` (core/resources.py) and the live `GpuRequest` (scheduler/gpus.py) are two
ways to write a share; the engine places a `Demand`, made from either, so that the replay, the
node daemon and the extender run the same code on the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpupool.core.resources import Request
from gpupool.core.units import MILLI_PER_GPU, MemoryShare
from gpupool.scheduler.gpus import GpuRequest
from gpupool.scheduler.types import IntArray


@dataclass(frozen=True)
class Demand:
    """`gpus` GPUs with `compute` milli and some memory on each, plus CPU and host memory.

    GPU memory on each GPU is `memory` bytes, or `memory_share` of that GPU's memory, or (with
    `proportional`) the same fraction of its memory as `compute` is of its compute; none of
    these: no GPU memory asked (the trace's pods).
    """

    gpus: int = 0
    compute: int = MILLI_PER_GPU
    cpu: int = 0
    host_memory: int = 0
    gpu_models: tuple[str, ...] = ()
    memory: int = 0
    memory_share: float = 0.0
    proportional: bool = False

    @property
    def is_fractional(self) -> bool:
        """Less than all of each GPU's compute."""
        return self.gpus > 0 and self.compute < MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        """GPU milli asked for over all GPUs (0 for a CPU-only demand)."""
        return self.gpus * self.compute if self.gpus else 0

    @cached_property
    def asks_memory(self) -> bool:
        """True when the demand takes GPU memory."""
        return self.gpus > 0 and (self.proportional or self.memory > 0 or self.memory_share > 0)

    @cached_property
    def shape(self) -> tuple[int, int, int, int, float, bool, tuple[str, ...]]:
        """What decides where it fits and what it leaves (a cache key)."""
        milli = self.compute if self.gpus else 0
        return (
            self.cpu,
            milli,
            self.gpus,
            self.memory,
            self.memory_share,
            self.proportional,
            self.gpu_models,
        )

    def memory_on(self, total: IntArray) -> IntArray:
        """Bytes taken on GPUs of `total` bytes each (as GpuRequest.memory_on resolves them)."""
        if self.proportional:
            proportional: IntArray = total * self.compute // MILLI_PER_GPU
            return proportional
        if self.memory_share:
            share: IntArray = (total * self.memory_share).astype(np.int64)
            return share
        return np.full(np.shape(total), self.memory, np.int64)


def demand_of(request: Request | GpuRequest | Demand) -> Demand:
    """The demand of a trace pod, a live share or a demand (returned as it is)."""
    if isinstance(request, Demand):
        return request
    if isinstance(request, GpuRequest):
        memory = request.memory
        if memory is None:
            return Demand(
                request.gpus, request.compute, 0, 0, request.gpu_models, proportional=True
            )
        if isinstance(memory, MemoryShare) and memory.bytes is None:
            assert memory.fraction is not None
            return Demand(
                request.gpus,
                request.compute,
                0,
                0,
                request.gpu_models,
                memory_share=memory.fraction,
            )
        size = memory if isinstance(memory, int) else memory.resolve(0)
        return Demand(request.gpus, request.compute, 0, 0, request.gpu_models, memory=size)
    return Demand(
        request.gpus,
        request.compute,
        request.cpu,
        request.host_memory,
        request.gpu_models,
        memory=request.memory or 0,
    )
