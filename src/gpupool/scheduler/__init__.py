"""Placement engine: cluster state, feasibility, policies, priorities."""

from gpupool.scheduler.demand import Demand, demand_of
from gpupool.scheduler.fragment import FragmentIndex, fragment_index
from gpupool.scheduler.names import DEFAULT_POLICY, POLICY_NAMES, check_policy
from gpupool.scheduler.placement import place
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.registry import make_policy
from gpupool.scheduler.state import ClusterState, Placement
from gpupool.scheduler.workload import PodSpec, TargetWorkload

__all__ = [
    "DEFAULT_POLICY",
    "POLICY_NAMES",
    "ClusterState",
    "Demand",
    "FragmentIndex",
    "Placement",
    "PodSpec",
    "Policy",
    "TargetWorkload",
    "check_policy",
    "demand_of",
    "fragment_index",
    "make_policy",
    "place",
]
