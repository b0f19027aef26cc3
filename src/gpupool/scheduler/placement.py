"""One placement decision: the feasible nodes of a cluster state, then a policy's choice."""

from __future__ import annotations

import numpy as np

from gpupool.core.resources import Request
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.state import ClusterState, Placement


def place(state: ClusterState, request: Request, policy: Policy) -> Placement | None:
    """Ask `policy` for a placement among the nodes of `state` where `request` fits; None when
    nothing fits."""
    feasible = np.flatnonzero(state.feasible(request))
    if feasible.size == 0:
        return None
    return policy.choose(state, request, feasible)
