"""An upper bound on the GPU milli any placement of a set of pods into a cluster can allocate.

The problem: choose a subset of the pods and put each on a node, as the replay would (CPU and
host memory fit; the node's GPU model is one the pod allows; a fractional pod takes part of one
GPU, a k-GPU pod k whole GPUs), maximising the GPU milli placed. Nodes of the same (CPU, memory,
GPU count, model) are interchangeable: the cluster is N_t nodes of each type t.

The LP, per node type t (every variable >= 0):
- x[s, t]: pods of shape s on type t; at most c_s pods of shape s over all types, and at most
  N_t times the copies of s one node of type t can hold;
- g[f, t]: GPUs of type t filled with the *GPU pattern* f, a multiset of fractional sizes that
  fits 1000 milli; the pods of each size on t are at most the slots of that size their GPUs hold;
- GPUs: the whole-GPU pods' GPUs plus the patterned GPUs are at most N_t * k_t;
- CPU and host memory of type t: the sums over its pods are at most N_t times a node's, and the
  same for the dual-feasible functions u_1..u_3 of the requests (Fekete and Schepers: a node
  holds items whose u(request / capacity) sum to at most 1), which count per node what the plain
  sums lose (two pods of 60 % of a node's CPU never share one);
- maximise the GPU milli of the x.

Every real placement is a point of it: count its pods per shape and type, and each GPU's
fractional pods as a pattern. So the LP's optimum is an upper bound on what any placement can
allocate. The GPU patterns are generated (column generation): the restricted LP gives prices
pi[t, m] per size and mu_t per GPU; the pattern of highest value sum_m pi[t, m] f_m is an
unbounded knapsack over 1000 milli, solved exactly by dynamic programming. The number returned
is the restricted LP's dual value plus N_t * k_t times each type's best pattern's excess over
mu_t, which is the value of a feasible dual of the full LP: an upper bound at every iteration,
equal to the LP's optimum when no pattern has an excess.

Leaving pods out is allowed (any subset), so CPU-only pods, which allocate no GPU milli, are
never placed by the bound, and a pod may be left out though it fits: the replay must place
both. That, and the node's CPU and memory counted per type rather than per node, are where the
bound is looser than the true optimum.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import MILLI_PER_GPU

MAX_ROUNDS = 200
#: a pattern enters when it is worth this much more than a GPU's price (milli)
ENTER = 1e-6
#: the dual-feasible functions u_k (k = 1..3) the CPU and memory rows use
DFF_ORDERS = (1, 2, 3)


@dataclass(frozen=True)
class NodeType:
    cpu: int
    memory: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Shape:
    """Pods that are the same for placement: CPU, host memory, GPU count, milli per GPU, models."""

    cpu: int
    memory: int
    gpus: int
    milli: int
    models: tuple[str, ...]

    @property
    def value(self) -> int:
        return self.gpus * self.milli

    @property
    def is_share(self) -> bool:
        return self.gpus == 1 and self.milli < MILLI_PER_GPU

    def fits_alone(self, node: NodeType) -> bool:
        return (
            self.cpu <= node.cpu
            and self.memory <= node.memory
            and self.gpus <= node.gpus
            and (not self.models or node.model in self.models)
        )

    def most_per_node(self, node: NodeType) -> int:
        gpu = node.gpus * (MILLI_PER_GPU // self.milli) if self.is_share else node.gpus // self.gpus
        cpu = node.cpu // self.cpu if self.cpu else gpu
        memory = node.memory // self.memory if self.memory else gpu
        return min(gpu, cpu, memory)


def node_types(nodes: Sequence[NodeSpec]) -> Counter[NodeType]:
    return Counter(NodeType(n.cpu, n.host_memory, n.gpu_count, n.gpu_model) for n in nodes)


def shapes(pods: Sequence[Request]) -> Counter[Shape]:
    """The GPU pods by shape (CPU-only ones allocate nothing: see the module's docstring)."""
    return Counter(
        Shape(p.cpu, p.host_memory, p.gpus, p.compute, tuple(sorted(set(p.gpu_models))))
        for p in pods
        if p.gpus > 0
    )


def dff(order: int, part: Fraction) -> Fraction:
    """Fekete and Schepers' dual-feasible function u_k of a fraction of a capacity."""
    scaled = part * (order + 1)
    return part if scaled.denominator == 1 else Fraction(int(scaled), order)


@dataclass
class Bound:
    """`upper`: the GPU milli no placement can beat; what the LP's solution leaves idle."""

    upper: float
    rounds: int
    seconds: float
    #: pods the LP leaves out, per shape (fractional)
    left_out: dict[Shape, float] = field(default_factory=dict)
    #: per node type: (GPU milli idle in whole GPUs, GPU milli idle in patterned GPUs)
    idle: dict[NodeType, tuple[float, float]] = field(default_factory=dict)


class _Rows:
    """A sparse <= system built row by row."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int, float]] = []
        self.limits: list[float] = []

    def add(self, coefs: dict[int, float], limit: float) -> int:
        row = len(self.limits)
        self.entries.extend((row, j, c) for j, c in coefs.items() if c)
        self.limits.append(limit)
        return row

    def matrix(self, columns: int) -> coo_array:
        if not self.entries:
            return coo_array((len(self.limits), columns))
        rows, cols, values = zip(*self.entries, strict=True)
        return coo_array((values, (rows, cols)), shape=(len(self.limits), columns))


@dataclass
class _Model:
    kinds: list[NodeType]
    supply: list[int]
    shape_list: list[Shape]
    demand: list[int]
    #: (shape index, type index) of each x column
    pairs: list[tuple[int, int]]
    #: per type: the fractional sizes its pods may have
    sizes: list[list[int]]
    #: (type index, pattern as size -> count) of each g column, after the x columns
    patterns: list[tuple[int, dict[int, int]]] = field(default_factory=list)
    #: fractional sizes whose every pod must be placed (a what-if, not a bound for every policy)
    must_place: frozenset[int] = frozenset()


def _model(nodes: Sequence[NodeSpec], pods: Sequence[Request]) -> _Model:
    types, counted = node_types(nodes), shapes(pods)
    kinds, shape_list = list(types), list(counted)
    pairs = [
        (i, t)
        for i, s in enumerate(shape_list)
        for t, kind in enumerate(kinds)
        if s.fits_alone(kind) and s.most_per_node(kind) > 0
    ]
    sizes: list[set[int]] = [set() for _ in kinds]
    for i, t in pairs:
        if shape_list[i].is_share:
            sizes[t].add(shape_list[i].milli)
    model = _Model(
        kinds,
        [types[k] for k in kinds],
        shape_list,
        [counted[s] for s in shape_list],
        pairs,
        [sorted(found) for found in sizes],
    )
    # one pattern per size to start: as many copies as fit one GPU
    model.patterns = [
        (t, {m: MILLI_PER_GPU // m}) for t, found in enumerate(model.sizes) for m in found
    ]
    return model


def _rows(model: _Model) -> tuple[_Rows, list[int], dict[tuple[int, int], int]]:
    """The LP's rows; (rows, each type's GPU row, each (type, size)'s slot row)."""
    rows, n_x = _Rows(), len(model.pairs)
    by_shape: dict[int, dict[int, float]] = defaultdict(dict)
    by_type: dict[int, list[int]] = defaultdict(list)
    for j, (i, t) in enumerate(model.pairs):
        by_shape[i][j] = 1.0
        by_type[t].append(j)
        kind, shape = model.kinds[t], model.shape_list[i]
        rows.add({j: 1.0}, model.supply[t] * shape.most_per_node(kind))
    for i, coefs in by_shape.items():
        rows.add(coefs, model.demand[i])
        if model.shape_list[i].is_share and model.shape_list[i].milli in model.must_place:
            rows.add({j: -c for j, c in coefs.items()}, -model.demand[i])
    gpu_rows, slot_rows = [], {}
    for t, kind in enumerate(model.kinds):
        columns = by_type[t]
        shape_of = {j: model.shape_list[model.pairs[j][0]] for j in columns}
        for resource, capacity in (("cpu", kind.cpu), ("memory", kind.memory)):
            for order in DFF_ORDERS:
                coefs = {
                    j: float(dff(order, Fraction(getattr(s, resource), capacity)))
                    for j, s in shape_of.items()
                }
                rows.add(coefs, model.supply[t])
        whole = {j: float(s.gpus) for j, s in shape_of.items() if not s.is_share}
        patterned = {n_x + p: 1.0 for p, (pt, _) in enumerate(model.patterns) if pt == t}
        gpu_rows.append(rows.add({**whole, **patterned}, model.supply[t] * kind.gpus))
        for m in model.sizes[t]:
            coefs = {j: 1.0 for j, s in shape_of.items() if s.is_share and s.milli == m}
            for p, (pt, pattern) in enumerate(model.patterns):
                if pt == t and m in pattern:
                    coefs[n_x + p] = -float(pattern[m])
            slot_rows[(t, m)] = rows.add(coefs, 0.0)
    return rows, gpu_rows, slot_rows


def best_pattern(sizes: Sequence[int], prices: Sequence[float]) -> tuple[float, dict[int, int]]:
    """The multiset of `sizes` (with repeats) that fits one GPU and has the most value."""
    best = [0.0] * (MILLI_PER_GPU + 1)
    choice = [-1] * (MILLI_PER_GPU + 1)
    for used in range(1, MILLI_PER_GPU + 1):
        best[used] = best[used - 1]
        for k, (size, price) in enumerate(zip(sizes, prices, strict=True)):
            if size <= used and best[used - size] + price > best[used] + 1e-12:
                best[used], choice[used] = best[used - size] + price, k
    pattern: Counter[int] = Counter()
    used = MILLI_PER_GPU
    while used > 0:
        if choice[used] < 0 or best[used] == best[used - 1]:
            used -= 1
            continue
        pattern[sizes[choice[used]]] += 1
        used -= sizes[choice[used]]
    return best[MILLI_PER_GPU], dict(pattern)


def placement_bound(
    nodes: Sequence[NodeSpec], pods: Sequence[Request], must_place: frozenset[int] = frozenset()
) -> Bound:
    """The upper bound on the GPU milli `pods` can allocate on `nodes` (see the docstring).
    With `must_place`, every fractional pod of those sizes is placed: the bound of placements
    that never leave one out (infeasible: NaN)."""
    started = time.perf_counter()
    model = _model(nodes, pods)
    model.must_place = must_place
    upper, rounds = (
        float(sum(s.value * c for s, c in zip(model.shape_list, model.demand, strict=True))),
        0,
    )
    if not model.pairs:
        return Bound(0.0, 0, time.perf_counter() - started)
    while rounds < MAX_ROUNDS:
        rounds += 1
        rows, gpu_rows, slot_rows = _rows(model)
        result = _solve(model, rows)
        if result.status != 0:  # only a what-if's forced pods can make it infeasible
            return Bound(float("nan"), rounds, time.perf_counter() - started)
        duals = np.maximum(-result.ineqlin.marginals, 0.0)
        excess_total, fresh = 0.0, []
        for t, kind in enumerate(model.kinds):
            if not model.sizes[t]:
                continue
            prices = [duals[slot_rows[(t, m)]] for m in model.sizes[t]]
            worth, pattern = best_pattern(model.sizes[t], prices)
            excess = max(0.0, worth - duals[gpu_rows[t]])
            excess_total += model.supply[t] * kind.gpus * excess
            if excess > ENTER and pattern not in [p for pt, p in model.patterns if pt == t]:
                fresh.append((t, pattern))
        upper = min(upper, -float(result.fun) + excess_total)
        if not fresh:
            break
        model.patterns.extend(fresh)
    return Bound(upper, rounds, time.perf_counter() - started, *_explain(model, result.x))


def _solve(model: _Model, rows: _Rows):  # type: ignore[no-untyped-def]
    n_x = len(model.pairs)
    cost = np.zeros(n_x + len(model.patterns))
    cost[:n_x] = [-model.shape_list[i].value for i, _ in model.pairs]
    return linprog(
        cost,
        A_ub=rows.matrix(len(cost)).tocsr(),
        b_ub=np.array(rows.limits),
        bounds=(0, None),
        method="highs",
    )


def _explain(
    model: _Model, x: np.ndarray
) -> tuple[dict[Shape, float], dict[NodeType, tuple[float, float]]]:
    """Where the LP's solution leaves GPU milli idle: pods left out, GPUs unused or part-filled."""
    n_x = len(model.pairs)
    placed: Counter[int] = Counter()
    whole_gpus: Counter[int] = Counter()
    for j, (i, t) in enumerate(model.pairs):
        placed[i] += x[j]
        if not model.shape_list[i].is_share:
            whole_gpus[t] += x[j] * model.shape_list[i].gpus
    left_out = {
        s: model.demand[i] - placed[i]
        for i, s in enumerate(model.shape_list)
        if model.demand[i] - placed[i] > 1e-6
    }
    share_gpus: Counter[int] = Counter()
    share_milli: Counter[int] = Counter()
    for j, (i, t) in enumerate(model.pairs):
        if model.shape_list[i].is_share:
            share_milli[t] += x[j] * model.shape_list[i].milli
    for p, (t, _) in enumerate(model.patterns):
        share_gpus[t] += x[n_x + p]
    idle = {
        kind: (
            (model.supply[t] * kind.gpus - whole_gpus[t] - share_gpus[t]) * MILLI_PER_GPU,
            share_gpus[t] * MILLI_PER_GPU - share_milli[t],
        )
        for t, kind in enumerate(model.kinds)
    }
    return left_out, idle
