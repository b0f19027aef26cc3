"""FGD's node fragment F_n for a target workload, cached per node and scored as array operations.

For spec m (cpu c_m, per-GPU milli u_m, k_m GPUs, allowed models) and node n (free CPU c, free
milli g_1..g_k, G = sum g_i), fragment_n(m) is G when m needs no GPU, when n's model is not
allowed, or when m does not fit (c < c_m or fewer than k_m GPUs with g_i >= u_m); otherwise it is
the sum of the g_i < u_m. F_n = sum_m p_m fragment_n(m).

Two per-(node, spec) counters make this incremental: cnt[n, m] = #{i: g_i >= u_m} and
less[n, m] = sum{g_i: g_i < u_m}. Changing one GPU from g to g' shifts each by a term that
depends only on g, g' and u_m, so the fragment after a hypothetical placement on many
candidate (node, GPU) pairs is a few (K, M) array operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.state import ClusterState, FloatArray, IntArray
from gpupool.scheduler.workload import TargetWorkload

#: request shapes whose per-node answers are kept (oldest dropped first); the trace has ~150
MAX_CACHED_SHAPES = 512


@dataclass
class AfterCache:
    """Per node, for one request shape: F after placing it, the GPU it would use, and the node
    version this was computed at (-1: never)."""

    after: FloatArray
    gpus: IntArray
    seen: IntArray


class FragmentIndex:
    """F_n for every node of a ClusterState and one target workload, kept current."""

    def __init__(self, state: ClusterState, target: TargetWorkload) -> None:
        self.state = state
        self.target = target
        specs = target.specs
        self.spec_cpu: IntArray = np.array([s.cpu for s in specs], np.int64)
        self.spec_milli: IntArray = np.array([s.gpu_milli for s in specs], np.int64)
        self.spec_gpus: IntArray = np.array([s.gpus for s in specs], np.int64)
        self.prob: FloatArray = np.array(target.probabilities, np.float64)
        # model_ok[model id, m]: spec m needs a GPU and accepts that model
        model_ok = np.zeros((len(state.model_names), len(specs)), np.bool_)
        for j, spec in enumerate(specs):
            for i, model in enumerate(state.model_names):
                model_ok[i, j] = spec.gpus > 0 and (not spec.gpu_models or model in spec.gpu_models)
        self.model_ok = model_ok
        n, m = state.n_nodes, len(specs)
        self.cnt: IntArray = np.zeros((n, m), np.int64)
        self.less: IntArray = np.zeros((n, m), np.int64)
        self.frag: FloatArray = np.zeros(n, np.float64)
        #: bumped whenever a node's free resources change; invalidates cached answers for it
        self.version: IntArray = np.zeros(n, np.int64)
        self._after: dict[tuple[int, int, int], AfterCache] = {}
        self._refresh_rows(np.arange(n))

    @property
    def total(self) -> float:
        """Sum of F_n over the cluster (milli)."""
        return float(self.frag.sum())

    def refresh_node(self, node: int) -> None:
        """Recompute node `node` after its free resources changed."""
        self.version[node] += 1
        self._refresh_rows(np.array([node]))

    def after_cache(self, shape: tuple[int, int, int]) -> AfterCache:
        """The cache of per-node answers for a request shape (cpu, per-GPU milli, GPUs)."""
        cache = self._after.get(shape)
        if cache is None:
            if len(self._after) >= MAX_CACHED_SHAPES:
                del self._after[next(iter(self._after))]
            n = self.state.n_nodes
            cache = AfterCache(np.zeros(n), np.full(n, -1, np.int64), np.full(n, -1, np.int64))
            self._after[shape] = cache
        return cache

    def _refresh_rows(self, rows: IntArray) -> None:
        free = self.state.gpu_free[rows][:, :, None]  # (R, G, 1)
        thresholds = self.spec_milli[None, None, :]  # (1, 1, M)
        present = free >= 0
        self.cnt[rows] = np.count_nonzero(present & (free >= thresholds), axis=1)
        self.less[rows] = np.where(present & (free < thresholds), free, 0).sum(axis=1)
        self.frag[rows] = self.fragment(
            rows, self.cnt[rows], self.less[rows], self.state.gpu_free_total[rows], 0
        )

    def fragment(
        self,
        nodes: IntArray,
        cnt: IntArray,
        less: IntArray,
        gpu_total: IntArray,
        cpu_request: int,
    ) -> FloatArray:
        """F for rows `nodes` given their counters and free GPU total, after `cpu_request`
        milli-CPU is taken from each."""
        cpu_left = self.state.cpu_free[nodes] - cpu_request
        fits = (
            self.model_ok[self.state.model_id[nodes]]
            & (cpu_left[:, None] >= self.spec_cpu[None, :])
            & (cnt >= self.spec_gpus[None, :])
        )
        per_spec = np.where(fits, less, gpu_total[:, None])
        result: FloatArray = per_spec @ self.prob
        return result

    def after_share(
        self, nodes: IntArray, gpus: IntArray, milli: int, cpu_request: int
    ) -> FloatArray:
        """F of each candidate (nodes[j], gpus[j]) after a share of `milli` lands on that GPU."""
        old = self.state.gpu_free[nodes, gpus][:, None]
        new = old - milli
        u = self.spec_milli[None, :]
        cnt = self.cnt[nodes] - (old >= u) + (new >= u)
        less = self.less[nodes] - np.where(old < u, old, 0) + np.where(new < u, new, 0)
        total = self.state.gpu_free_total[nodes] - milli
        return self.fragment(nodes, cnt, less, total, cpu_request)

    def after_whole(self, nodes: IntArray, gpus: int, cpu_request: int) -> FloatArray:
        """F of each node in `nodes` after `gpus` completely free GPUs (and the CPU) are taken.

        A free GPU (1000 milli) counts in cnt for every spec (u_m <= 1000) and becomes 0, which
        adds nothing to `less`; so only cnt and the total move.
        """
        cnt = self.cnt[nodes] - gpus * (self.spec_milli[None, :] <= MILLI_PER_GPU)
        total = self.state.gpu_free_total[nodes] - gpus * MILLI_PER_GPU
        return self.fragment(nodes, cnt, self.less[nodes], total, cpu_request)


def fragment_index(state: ClusterState, target: TargetWorkload) -> FragmentIndex:
    """The fragment index of `state` for `target`, built once, then kept current by the state's
    allocate/release (only the changed node is recomputed)."""
    return state.observer(("fragment", target), lambda: FragmentIndex(state, target))
