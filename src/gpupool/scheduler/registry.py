"""Policies by name: the one place that knows every policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.scheduler.fgd import FgdPolicy
from gpupool.scheduler.gpupool_policy import GpupoolPolicy
from gpupool.scheduler.paper import (
    BestFitPolicy,
    ClusteringPolicy,
    DotProdPolicy,
    PackingPolicy,
    RandomPolicy,
)
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.share import BinpackPolicy, SpreadPolicy
from gpupool.scheduler.workload import TargetWorkload

DEFAULT_POLICY = "gpupool"

_SEEDED: dict[str, Callable[..., Policy]] = {
    "random": RandomPolicy,
    "dotprod": DotProdPolicy,
    "clustering": ClusteringPolicy,
    "packing": PackingPolicy,
    "bestfit": BestFitPolicy,
    "binpack": BinpackPolicy,
    "spread": SpreadPolicy,
}
_TARGETED: dict[str, Callable[..., Policy]] = {"fgd": FgdPolicy, "gpupool": GpupoolPolicy}

POLICY_NAMES: tuple[str, ...] = (
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "binpack",
    "spread",
    "gpupool",
)


def make_policy(
    name: str,
    *,
    seed: int,
    target_workload: TargetWorkload | Sequence[Request] = (),
) -> Policy:
    """A fresh policy. `target_workload` (FGD's M, or the requests to build it from) matters
    to `fgd` and `gpupool` only."""
    if name in _SEEDED:
        return _SEEDED[name](seed=seed)
    if name in _TARGETED:
        target = (
            target_workload
            if isinstance(target_workload, TargetWorkload)
            else TargetWorkload.from_requests(target_workload)
        )
        return _TARGETED[name](seed=seed, target=target)
    raise InvalidRequest(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
