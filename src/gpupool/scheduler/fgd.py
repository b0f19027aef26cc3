"""FGD (Fragmentation Gradient Descent): place where the expected fragment grows least."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.demand import Demand, demand_of
from gpupool.scheduler.fragment import AfterCache, FragmentIndex, fragment_index
from gpupool.scheduler.policy import Policy, Scores
from gpupool.scheduler.state import Asked, ClusterState, Placement
from gpupool.scheduler.types import BoolArray, FloatArray, IntArray
from gpupool.scheduler.workload import TargetWorkload


@dataclass(frozen=True)
class FragmentOptions:
    """The fragment each of `nodes` (feasible) would have after the placement, with the GPU
    used: views of the index's answers for the demand's shape, gathered only when asked."""

    nodes: IntArray
    index: FragmentIndex
    answers: AfterCache

    @property
    def gpus(self) -> IntArray:
        """Chosen GPU per node for a one-GPU demand; -1 otherwise."""
        return self.answers.gpus[self.nodes]

    @property
    def before(self) -> FloatArray:
        return self.index.frag[self.nodes]

    @property
    def after(self) -> FloatArray:
        return self.answers.after[self.nodes]

    @property
    def delta(self) -> FloatArray:
        """Decrease of the node's fragment (higher is better): before - after."""
        return self.answers.delta[self.nodes]


#: stale nodes up to which the one-GPU share case is worked out in plain Python
FEW_NODES = 8


@functools.cache
def _earlier(width: int) -> BoolArray:
    """[i, j]: slot j comes before slot i."""
    result: BoolArray = np.tri(width, k=-1, dtype=np.bool_)
    return result


def distinct_fitting(free: IntArray, milli: int) -> tuple[IntArray, IntArray]:
    """(row, column) of GPUs with >= `milli` free, keeping only the lowest index of each distinct
    free value in a row: equal GPUs give equal outcomes, and lowest index wins ties anyway."""
    width = free.shape[1]
    # same[k, i, j]: GPU i repeats the free value of an earlier GPU j of its row
    same = (free[:, :, None] == free[:, None, :]) & _earlier(width)
    rows, cols = np.nonzero((free >= milli) & ~same.any(axis=2))
    return rows.astype(np.int64), cols.astype(np.int64)


def fragment_options(
    index: FragmentIndex, asked: Asked, nodes: IntArray, charge: FloatArray | None = None
) -> FragmentOptions:
    """F after placing `request` on each node of `nodes` (the best GPU per node for a one-GPU
    demand: lowest F after, lowest index on ties; the fullest GPUs for more).

    `charge`, for a one-GPU share only, is added to F after on a GPU by its free milli (row
    free + 1, as `packing.SharePrices.lost`): the GPU is then the one where the sum is lowest,
    and the sum is the answer's "after".

    Pods repeat a few shapes, and a placement changes one node, so the answer per (shape, node)
    is cached and only nodes changed since the shape was last asked about are recomputed.
    """
    request = demand_of(asked)
    # in a simple state a node's GPUs are all one model: the answer on a feasible node does not
    # depend on which models the demand allows, so demands that differ only there share it
    shape = request.shape[:-1] if index.simple else request.shape
    cache = index.after_cache(shape if charge is None else (*shape, "charged"))
    stale = nodes[cache.seen[nodes] != index.version[nodes]]
    if stale.size:
        after, gpus = _after(index, request, stale, charge)
        cache.after[stale] = after
        cache.gpus[stale] = gpus
        cache.seen[stale] = index.version[stale]
        # element by element, so the same values as over all `nodes` at once
        delta = index.frag[stale] - after
        cache.delta[stale] = delta
        cache.fgd[stale] = fgd_score(delta)
    return FragmentOptions(nodes, index, cache)


def fullest(state: ClusterState, request: Demand, nodes: IntArray) -> BoolArray:
    """(nodes, slots): the `request.gpus` fullest fitting GPUs of each node (as
    ClusterState.ordered_gpus orders them)."""
    fits = state.gpu_fits(request, nodes)
    slots = np.broadcast_to(np.arange(fits.shape[1]), fits.shape)
    order = np.lexsort((slots, state.gpu_mem_free[nodes], state.gpu_free[nodes], ~fits), axis=-1)
    chosen = np.zeros(fits.shape, np.bool_)
    np.put_along_axis(chosen, order[:, : request.gpus], True, axis=1)
    result: BoolArray = chosen & fits
    return result


def _after(
    index: FragmentIndex, request: Demand, nodes: IntArray, charge: FloatArray | None = None
) -> tuple[FloatArray, IntArray]:
    state = index.state
    no_gpu = np.full(nodes.size, -1, np.int64)
    plain = index.simple and not request.asks_memory
    if nodes.size == 1 and plain and (request.gpus == 0 or request.compute == MILLI_PER_GPU):
        # one node (the one the last placement changed): `fragment` of one row, as scalars
        node = int(nodes[0])
        cnt, total = index.cnt[node], state.gpu_free_total[node]
        if request.gpus:
            cnt = cnt - request.gpus * index.specs.whole_held
            total = total - request.gpus * MILLI_PER_GPU
        return np.array(
            [index.fragment_of(node, cnt, index.less[node], total, request.cpu)]
        ), no_gpu
    if request.gpus == 0:
        after = index.fragment(
            nodes, index.cnt[nodes], index.less[nodes], state.gpu_free_total[nodes], request.cpu
        )
        return after, no_gpu
    if plain and request.compute == MILLI_PER_GPU:
        return index.after_whole(nodes, request.gpus, request.cpu), no_gpu
    if request.gpus > 1:
        chosen = fullest(state, request, nodes)
        memory = request.memory_on(state.gpu_mem_total[nodes])
        after = index.after_taking(nodes, chosen, request.compute, memory, request.cpu)
        return after, no_gpu
    if plain and nodes.size <= FEW_NODES:
        return _share_after_few(index, request, nodes, charge)
    if plain:  # the nodes are feasible: in a simple state, every GPU is of an allowed model
        rows, cols = distinct_fitting(state.gpu_free[nodes], request.compute)
    else:
        rows, cols = (x.astype(np.int64) for x in np.nonzero(state.gpu_fits(request, nodes)))
    memory = request.memory_on(state.gpu_mem_total[nodes[rows], cols])
    cand_after = index.after_share(nodes[rows], cols, request.compute, memory, request.cpu)
    if charge is not None:
        cand_after += charge[state.gpu_free[nodes[rows], cols] + 1]
    # per row (nonzero is row-major, so each row's candidates are contiguous, by column)
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    best_after = np.minimum.reduceat(cand_after, starts)
    is_best = cand_after == np.repeat(best_after, np.diff(np.r_[starts, rows.size]))
    first_best = np.flatnonzero(is_best)
    _, pick = np.unique(rows[first_best], return_index=True)
    return best_after, cols[first_best[pick]]


def _share_after_few(
    index: FragmentIndex, request: Demand, nodes: IntArray, charge: FloatArray | None
) -> tuple[FloatArray, IntArray]:
    """The plain one-GPU share case of `_after` for a few nodes (usually the one a placement
    changed): the same candidates (distinct_fitting's) and the same fragment call, the
    bookkeeping around them in plain Python, which costs less than numpy's per-call overhead
    at this size."""
    milli = request.compute
    rows: list[int] = []
    cols: list[int] = []
    for row, free in enumerate(index.state.gpu_free[nodes].tolist()):
        seen: set[int] = set()
        for col, value in enumerate(free):
            if value >= milli and value not in seen:
                rows.append(row)
                cols.append(col)
            seen.add(value)
    slots = np.array(cols, np.int64)
    where = nodes[rows]
    memory = request.memory_on(index.state.gpu_mem_total[where, slots])
    cand_after = index.after_share(where, slots, milli, memory, request.cpu)
    if charge is not None:
        cand_after += charge[index.state.gpu_free[where, slots] + 1]
    # per node the lowest F after, the lowest slot on ties (rows come in order, slots ascending)
    best_after = [0.0] * nodes.size
    best_gpu = [-1] * nodes.size
    for row, col, after in zip(rows, cols, cand_after.tolist(), strict=True):
        if best_gpu[row] < 0 or after < best_after[row]:
            best_after[row] = after
            best_gpu[row] = col
    return np.array(best_after, np.float64), np.array(best_gpu, np.int64)


def placement_for(
    state: ClusterState, request: Demand, options: FragmentOptions, at: int
) -> Placement:
    """The placement that `options` scored at position `at`."""
    node = int(options.nodes[at])
    gpu = int(options.answers.gpus[node])
    if request.gpus == 1 and gpu >= 0:
        return Placement(node, (gpu,), request.compute)
    return state.best_gpu_placement(node, request)


class TargetedPolicy(Policy):
    """A policy that scores nodes by FGD's fragment of a target workload."""

    def __init__(self, *, seed: int, target: TargetWorkload) -> None:
        super().__init__(seed=seed)
        self.target = target

    def options(self, state: ClusterState, request: Demand, nodes: IntArray) -> FragmentOptions:
        return fragment_options(fragment_index(state, self.target), request, nodes)

    def gpus_on(self, state: ClusterState, demand: Demand, node: int) -> Placement:
        nodes = np.array([node], np.int64)
        return placement_for(state, demand, self.options(state, demand, nodes), 0)

    def choose(self, state: ClusterState, demand: Demand, feasible: IntArray) -> Placement:
        options = self.options(state, demand, feasible)
        scores = self.scores_of(state, demand, options)
        return placement_for(state, demand, options, self.best_index(state, feasible, scores))

    def scores(self, state: ClusterState, demand: Demand, nodes: IntArray) -> FloatArray:
        scores = self.scores_of(state, demand, self.options(state, demand, nodes))
        result: FloatArray = scores.astype(np.float64)
        return result

    def scores_of(self, state: ClusterState, demand: Demand, options: FragmentOptions) -> Scores:
        """Score per node of `options` (higher wins): FGD's, by default."""
        return fgd_scores(options)


class FgdPolicy(TargetedPolicy):
    """score = int(100 * sigmoid(delta / 1000)); highest wins, ties go to node order."""

    name = "fgd"


def fgd_scores(options: FragmentOptions) -> IntArray:
    """FGD's integer score per node of `options`, int(100 * sigmoid(delta / 1000))."""
    return options.answers.fgd[options.nodes]


def fgd_score(delta: FloatArray) -> IntArray:
    """FGD's integer score of fragment decreases, int(100 * sigmoid(delta / 1000))."""
    scores: IntArray = (100.0 / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)
    return scores
