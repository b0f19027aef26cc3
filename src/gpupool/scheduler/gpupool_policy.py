"""`gpupool`, the default policy: FGD's fragment gradient without its integer rounding."""

from __future__ import annotations

import numpy as np

from gpupool.core.resources import Request
from gpupool.scheduler.fgd import fragment_options, placement_for
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.state import ClusterState, IntArray, Placement
from gpupool.scheduler.workload import TargetWorkload


class GpupoolPolicy(Policy):
    """Highest raw fragment decrease; ties: least free GPU after, least free CPU after."""

    name = "gpupool"

    def __init__(self, *, seed: int, target: TargetWorkload) -> None:
        super().__init__(seed=seed)
        self.target = target

    def choose(self, state: ClusterState, request: Request, feasible: IntArray) -> Placement:
        options = fragment_options(state.fragment_index(self.target), request, feasible)
        delta = np.round(options.delta, 6)
        gpu_left = state.gpu_free_total[feasible] - request.total_gpu_milli
        cpu_left = state.cpu_free[feasible] - request.cpu
        rank = self.node_rank(state.n_nodes)[feasible]
        at = int(np.lexsort((rank, cpu_left, gpu_left, -delta))[0])
        return placement_for(state, request, options, at)
