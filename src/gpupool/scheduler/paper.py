"""The five baseline policies of the FGD paper: random, dotprod, clustering, packing, bestfit.

Each follows the published benchmark procedure exactly, integer arithmetic included, because
the integer scores decide ties and ties decide the curves.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.demand import Demand
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.state import ClusterState, IntArray, Placement, pod_class
from gpupool.scheduler.types import FloatArray

#: the paper's normalisers: the largest node has 128 cores and 8 GPUs
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8 * MILLI_PER_GPU
MAX_SCORE = 100


class RandomPolicy(Policy):
    """A uniformly random feasible node, then a random fitting GPU."""

    name = "random"

    def __init__(self, *, seed: int) -> None:
        super().__init__(seed=seed)
        self._rng = np.random.default_rng(seed)

    def scores(self, state: ClusterState, request: Demand, nodes: IntArray) -> FloatArray:
        """A random score per node (the extender ranks by it)."""
        drawn: FloatArray = self._rng.random(nodes.size)
        return drawn

    def gpus_on(self, state: ClusterState, request: Demand, node: int) -> Placement:
        if not request.is_fractional:
            return state.best_gpu_placement(node, request)
        gpus = state.fitting_gpus(node, request)
        picked = (
            self._rng.choice(gpus, size=request.gpus, replace=False)
            if request.gpus > 1
            else ([gpus[self._rng.integers(gpus.size)]])
        )
        return Placement(node, tuple(sorted(int(g) for g in picked)), request.compute)

    def choose(self, state: ClusterState, request: Demand, feasible: IntArray) -> Placement:
        node = int(feasible[self._rng.integers(feasible.size)])
        return self.gpus_on(state, request, node)


class DotProdPolicy(Policy):
    """Tetris-style: the smallest dot product of the node's free vector and the pod's demand."""

    name = "dotprod"

    def scores(self, state: ClusterState, request: Demand, nodes: IntArray) -> IntArray:
        dot = (request.cpu / MAX_CPU_MILLI) * (state.cpu_free[nodes] / MAX_CPU_MILLI) + (
            request.total_gpu_milli / MAX_GPU_MILLI
        ) * (state.gpu_free_total[nodes] / MAX_GPU_MILLI)
        return np.floor(MAX_SCORE * (1 - dot / 2)).astype(np.int64)


class ClusteringPolicy(Policy):
    """Put pods of one class (share, 1-GPU, 2-GPU, ...) together, in four tiers of 25 points:
    only this class > mixed with this class > empty node > other classes only. Within a tier,
    25 * (8000 - free GPU milli) // 8000 (the less free, the higher). CPU-only pods: 0."""

    name = "clustering"

    def scores(self, state: ClusterState, request: Demand, nodes: IntArray) -> IntArray:
        if request.gpus == 0:
            return np.zeros(nodes.size, np.int64)
        within = (MAX_SCORE // 4) * (MAX_GPU_MILLI - state.gpu_free_total[nodes]) // MAX_GPU_MILLI
        classes = state.classes_held[nodes]
        has_own = state.class_pods[nodes, pod_class(request)] > 0
        tier = np.where(has_own, np.where(classes == 1, 3, 2), np.where(classes == 0, 1, 0)).astype(
            np.int64
        )
        result: IntArray = tier * (MAX_SCORE // 4) + within
        return result


class PackingPolicy(Policy):
    """Prefer partly used GPUs, then free GPUs on a node in use, then an idle node."""

    name = "packing"

    def scores(self, state: ClusterState, request: Demand, nodes: IntArray) -> IntArray:
        if request.gpus == 0:
            return np.zeros(nodes.size, np.int64)
        gpu_count = state.gpu_count[nodes]
        idle = state.full_free[nodes] == gpu_count
        idle_score = np.maximum(MAX_SCORE // 3 - gpu_count, gpu_count)
        if request.is_fractional:
            free = state.gpu_free[nodes]
            best = np.where(free >= request.compute, free, MILLI_PER_GPU + 1).min(axis=1)
            uses_free_gpu = best == MILLI_PER_GPU
            shared = np.maximum(MAX_SCORE - (best * 100 // MILLI_PER_GPU) // 10, MAX_SCORE // 2)
            used = np.where(uses_free_gpu, max(MAX_SCORE // 2 - 1, MAX_SCORE // 3), shared)
        else:
            used = np.full(nodes.size, max(MAX_SCORE // 2 - request.gpus, MAX_SCORE // 3))
        result: IntArray = np.where(idle, idle_score, used).astype(np.int64)
        return result


class BestFitPolicy(Policy):
    """The least CPU and GPU left after placement, min-max normalised to 0..100 per pod."""

    name = "bestfit"

    def scores(self, state: ClusterState, request: Demand, nodes: IntArray) -> IntArray:
        left = (state.cpu_free[nodes] - request.cpu) / MAX_CPU_MILLI * 0.5 + (
            state.gpu_free_total[nodes] - request.total_gpu_milli
        ) / MAX_GPU_MILLI * 0.5
        raw = np.floor((1.0 - left) * MAX_SCORE).astype(np.int64)
        low, high = int(raw.min()), int(raw.max())
        if high == low:
            return np.zeros(nodes.size, np.int64)
        result: IntArray = (raw - low) * MAX_SCORE // (high - low)
        return result
