"""`binpack` and `spread`, the node- and GPU-level policies GPU-sharing schedulers offer.

Following HAMi and Alibaba's GPU-share scheduler: a node's usage is the fraction of its GPU milli
in use (of its CPU for a CPU-only request). `binpack` takes the most used feasible node and, in it,
the fullest GPU that still fits; `spread` takes the least used node and its emptiest fitting GPU.
Ties go to node order; between GPUs, to free memory (least for binpack, most for spread), then
the lowest slot. Whole-GPU requests take the first free GPUs by slot (every free GPU is equally
full).
"""

from __future__ import annotations

import numpy as np

from gpupool.scheduler.demand import Demand
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.state import ClusterState, FloatArray, IntArray, Placement


def node_usage(state: ClusterState, request: Demand, nodes: IntArray) -> FloatArray:
    """Fraction in use of the resource the request cares most about, per node."""
    if request.gpus == 0:
        cpu: FloatArray = 1.0 - state.cpu_free[nodes] / np.maximum(state.cpu_capacity[nodes], 1)
        return cpu
    gpu: FloatArray = 1.0 - state.gpu_free_total[nodes] / np.maximum(state.gpu_capacity[nodes], 1)
    return gpu


class _SharePolicy(Policy):
    fullest_first = True

    def scores(self, state: ClusterState, request: Demand, nodes: IntArray) -> FloatArray:
        usage = node_usage(state, request, nodes)
        return usage if self.fullest_first else -usage

    def gpus_on(self, state: ClusterState, request: Demand, node: int) -> Placement:
        return state.gpus_in_order(node, request, emptiest=not self.fullest_first)


class BinpackPolicy(_SharePolicy):
    """Fill the fullest feasible node, and in it the fullest fitting GPU."""

    name = "binpack"
    fullest_first = True


class SpreadPolicy(_SharePolicy):
    """Use the emptiest feasible node, and in it the emptiest fitting GPU."""

    name = "spread"
    fullest_first = False
