"""A share's priority in placement: a `low` share is opportunistic.

The compute arbiter runs a `low` share only in the time the guaranteed (`high`) shares leave,
so placement guarantees it no compute: it holds none, and it is placed as if every GPU's compute
were free, so it never keeps a `high` share out and goes beside shares that hold all of a GPU's
compute. Memory cannot be lent: every share holds its own. The node daemon's admission
(agent/node.py) and the Kubernetes extender (k8s/) both place by this rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.core.resources import Priority
from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.gpus import GpuView


def opportunistic(priority: Priority) -> bool:
    """A share of this priority holds no compute: it runs in the time the others leave."""
    return priority is Priority.LOW


def guaranteed_compute(priority: Priority, compute: int) -> int:
    """Milli-GPU a share asking for `compute` holds on each of its GPUs (none when it is
    opportunistic)."""
    return 0 if opportunistic(priority) else compute


def as_seen_by(priority: Priority, gpus: Sequence[GpuView]) -> tuple[GpuView, ...]:
    """`gpus` as placement sees them for a share of `priority`: to an opportunistic share, all
    compute is free."""
    if not opportunistic(priority):
        return tuple(gpus)
    return tuple(replace(gpu, compute_free=MILLI_PER_GPU) for gpu in gpus)
