"""Policies by name: the one place that makes every policy (names and their check: names.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpupool.core.resources import Request
from gpupool.scheduler.demand import Demand
from gpupool.scheduler.fgd import FgdPolicy
from gpupool.scheduler.gpupool_policy import GpupoolPolicy
from gpupool.scheduler.gpus import GpuRequest
from gpupool.scheduler.names import DEFAULT_POLICY, POLICY_NAMES, check_policy
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


def make_policy(
    name: str,
    *,
    seed: int,
    target_workload: TargetWorkload | Sequence[Request | GpuRequest | Demand] = (),
) -> Policy:
    """A fresh policy. `target_workload` (FGD's M, or the requests to build it from) matters
    to `fgd` and `gpupool` only."""
    check_policy(name)
    if name in _SEEDED:
        return _SEEDED[name](seed=seed)
    target = (
        target_workload
        if isinstance(target_workload, TargetWorkload)
        else TargetWorkload.from_requests(target_workload)
    )
    return _TARGETED[name](seed=seed, target=target)


__all__ = ["DEFAULT_POLICY", "POLICY_NAMES", "check_policy", "make_policy"]
