"""Placement engine: cluster state, feasibility, policies, priorities."""

from gpupool.scheduler.fragment import FragmentIndex, fragment_index
from gpupool.scheduler.placement import place
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.registry import DEFAULT_POLICY, POLICY_NAMES, make_policy
from gpupool.scheduler.state import ClusterState, Placement
from gpupool.scheduler.workload import PodSpec, TargetWorkload

__all__ = [
    "DEFAULT_POLICY",
    "POLICY_NAMES",
    "ClusterState",
    "FragmentIndex",
    "Placement",
    "PodSpec",
    "Policy",
    "TargetWorkload",
    "fragment_index",
    "make_policy",
    "place",
]
