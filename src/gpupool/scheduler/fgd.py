"""FGD (Fragmentation Gradient Descent): place where the expected fragment grows least."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.resources import Request
from gpupool.scheduler.fragment import FragmentIndex, fragment_index
from gpupool.scheduler.policy import Policy
from gpupool.scheduler.state import ClusterState, FloatArray, IntArray, Placement
from gpupool.scheduler.workload import TargetWorkload


@dataclass(frozen=True)
class FragmentOptions:
    """The fragment each feasible node would have after the placement, with the GPU used."""

    nodes: IntArray
    gpus: IntArray  # chosen GPU per node for a share; -1 otherwise
    before: FloatArray
    after: FloatArray

    @property
    def delta(self) -> FloatArray:
        """Decrease of the node's fragment (higher is better)."""
        result: FloatArray = self.before - self.after
        return result


def distinct_fitting(free: IntArray, milli: int) -> tuple[IntArray, IntArray]:
    """(row, column) of GPUs with >= `milli` free, keeping only the lowest index of each distinct
    free value in a row: equal GPUs give equal outcomes, and lowest index wins ties anyway."""
    fits = free >= milli
    for col in range(1, free.shape[1]):
        fits[:, col] &= ~(free[:, :col] == free[:, col : col + 1]).any(axis=1)
    rows, cols = np.nonzero(fits)
    return rows.astype(np.int64), cols.astype(np.int64)


def fragment_options(index: FragmentIndex, request: Request, nodes: IntArray) -> FragmentOptions:
    """F after placing `request` on each node of `nodes` (the best GPU per node for a share:
    lowest F after, lowest index on ties).

    Pods repeat a few shapes, and a placement changes one node, so the answer per (shape, node)
    is cached and only nodes changed since the shape was last asked about are recomputed.
    """
    milli = request.compute if request.gpus else 0
    cache = index.after_cache((request.cpu, milli, request.gpus))
    stale = nodes[cache.seen[nodes] != index.version[nodes]]
    if stale.size:
        after, gpus = _after(index, request, stale)
        cache.after[stale] = after
        cache.gpus[stale] = gpus
        cache.seen[stale] = index.version[stale]
    return FragmentOptions(nodes, cache.gpus[nodes], index.frag[nodes], cache.after[nodes])


def _after(index: FragmentIndex, request: Request, nodes: IntArray) -> tuple[FloatArray, IntArray]:
    state = index.state
    no_gpu = np.full(nodes.size, -1, np.int64)
    if request.gpus == 0:
        after = index.fragment(
            nodes, index.cnt[nodes], index.less[nodes], state.gpu_free_total[nodes], request.cpu
        )
        return after, no_gpu
    if not request.is_fractional:
        return index.after_whole(nodes, request.gpus, request.cpu), no_gpu
    rows, cols = distinct_fitting(state.gpu_free[nodes], request.compute)
    cand_after = index.after_share(nodes[rows], cols, request.compute, request.cpu)
    # per row (nonzero is row-major, so each row's candidates are contiguous, by column)
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    best_after = np.minimum.reduceat(cand_after, starts)
    is_best = cand_after == np.repeat(best_after, np.diff(np.r_[starts, rows.size]))
    first_best = np.flatnonzero(is_best)
    _, pick = np.unique(rows[first_best], return_index=True)
    return best_after, cols[first_best[pick]]


def placement_for(
    state: ClusterState, request: Request, options: FragmentOptions, at: int
) -> Placement:
    """The placement that `options` scored at position `at`."""
    node = int(options.nodes[at])
    if request.is_fractional:
        return Placement(node, (int(options.gpus[at]),), request.compute)
    return state.best_gpu_placement(node, request)


class FgdPolicy(Policy):
    """score = int(100 * sigmoid(delta / 1000)); highest wins, ties go to node order."""

    name = "fgd"

    def __init__(self, *, seed: int, target: TargetWorkload) -> None:
        super().__init__(seed=seed)
        self.target = target

    def choose(self, state: ClusterState, request: Request, feasible: IntArray) -> Placement:
        options = fragment_options(fragment_index(state, self.target), request, feasible)
        return placement_for(
            state, request, options, self.best_index(state, feasible, fgd_scores(options))
        )


def fgd_scores(options: FragmentOptions) -> IntArray:
    """FGD's integer score, int(100 * sigmoid(delta / 1000))."""
    scores: IntArray = (100.0 / (1.0 + np.exp(-options.delta / 1000.0))).astype(np.int64)
    return scores
