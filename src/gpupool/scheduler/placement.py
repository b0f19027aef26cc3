"""One placement decision: the feasible nodes of a cluster state, then a policy's choice."""

from __future__ import annotations

import numpy as np

from gpupool.scheduler.demand import demand_of
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.state import Asked, ClusterState, Placement


def place(state: ClusterState, request: Asked, policy: Policy) -> Placement | None:
    """Ask `policy` for a placement among the nodes of `state` where `request` fits; None when
    nothing fits."""
    demand = demand_of(request)
    feasible = np.flatnonzero(state.feasible(demand))
    if feasible.size == 0:
        return None
    return policy.choose(state, demand, feasible)
