"""What a GPU's free compute is worth to the shares expected next: the prices of the packing LP.

Fractional shares fill GPUs as items fill bins. Take the target workload's share sizes s (milli
of one GPU) with frequencies d_s, and the patterns a: the multisets of sizes that fit one GPU
(sum <= 1000). Packing the mix onto as few GPUs as possible, fractionally, is the linear program
min sum_a x_a subject to sum_a a_s x_a >= d_s. Its dual prices each size: y_s >= 0 with no
pattern worth more than a GPU (sum_s a_s y_s <= 1), maximising sum_s d_s y_s. A price says what
a share of that size is worth, in GPUs, where the mix packs as well as it can: on the Alibaba
trace an 810-milli share, whose 190 left over only rare tiny shares can use, costs a whole GPU;
a 470 half of one (two fill a GPU); a 650 two thirds, its 350 left over a 320's third.

V(g), the most that g milli of free compute can still earn (the best pattern that fits in g, by
price), is what the free compute of a GPU is worth. A share of s milli placed on a GPU with g
free earns y_s and leaves V(g - s): the value it throws away is

    lost(s, g) = V(g) - V(g - s) - y_s >= 0,

zero exactly where the placement is a step of an optimal packing, and more the worse it breaks
one: a 230 in a 650's 350 (only a 110 fits the 120 left, where a 320 would have filled it) loses
a third of a GPU less the 230's price; the same 230 beside a 550 (450 free, a 220 still to come)
loses nothing. FGD's fragment sees neither: both leave little free compute the next share could
use. `gpupool` charges this loss when it chooses a share's GPU (scheduler/gpupool_policy.py).

The dual is solved by cutting planes: the prices of the patterns met so far by the simplex
method, then the most valuable pattern at those prices (an unbounded knapsack over the GPU's
milli); while it is worth more than a GPU it joins the program. The sizes are integers, so the
knapsack runs over their greatest common divisor with 1000 (10 milli in the trace: 101 steps).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.spec_tables import kept_per_shape
from gpupool.scheduler.types import FloatArray
from gpupool.scheduler.workload import TargetWorkload

#: a pattern worth more than a GPU by more than this is a cut the program still needs
TOLERANCE = 1e-9
#: cutting-plane rounds at most (each adds one pattern; the trace's mix needs 12)
MAX_ROUNDS = 200
#: share sizes priced at most, the most frequent (a size beyond them is worth the best set of
#: priced ones that fits in it): the program grows fast with sizes (16 odd sizes of milli:
#: 30 ms at worst in 40 random mixes; 64: up to seconds), and a live window holds up to 64
#: shapes, whatever its users submit
MAX_PRICED = 16
#: decimals the loss is rounded to, so that float noise does not split GPUs that tie
DECIMALS = 9
#: pivots in a row that leave the objective where it was before the simplex turns to Bland's
#: rule (degenerate pivots are where Dantzig's rule can cycle)
STALLED_PIVOTS = 20


def share_sizes(target: TargetWorkload) -> dict[int, float]:
    """The target's fractional one-GPU shares: frequency per size in milli (their sum is the
    share of the target's pods that they are), the MAX_PRICED most frequent sizes."""
    sizes: dict[int, float] = {}
    for spec, p in zip(target.specs, target.probabilities, strict=True):
        if spec.is_share and p > 0:
            sizes[spec.gpu_milli] = sizes.get(spec.gpu_milli, 0.0) + p
    kept = sorted(sizes, key=lambda size: (-sizes[size], size))[:MAX_PRICED]
    return {size: sizes[size] for size in kept}


@dataclass
class SharePrices:
    """The packing LP's price per share size and the value V of free compute (see the module's
    docstring); `lost` gives a share size's loss per free milli."""

    #: y_s per share size of the target
    prices: dict[int, float]
    #: V(g) for g = 0..MILLI_PER_GPU
    value: FloatArray
    _lost: dict[tuple[object, ...], FloatArray] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, sizes: dict[int, float]) -> SharePrices:
        """Prices for shares of these sizes (milli, 1..999) and frequencies."""
        ordered = sorted(sizes)
        unit = math.gcd(MILLI_PER_GPU, *ordered) if ordered else MILLI_PER_GPU
        steps = [s // unit for s in ordered]
        prices = dual_prices(steps, [sizes[s] for s in ordered], MILLI_PER_GPU // unit)
        per_step, _ = best_patterns(steps, prices, MILLI_PER_GPU // unit)
        value: FloatArray = np.repeat(per_step, unit)[: MILLI_PER_GPU + 1]
        return cls(dict(zip(ordered, prices.tolist(), strict=True)), value)

    def price(self, milli: int) -> float:
        """y_s of a target size; another size is worth the best pattern that fits in it."""
        found = self.prices.get(milli)
        return found if found is not None else float(self.value[milli])

    def lost(self, milli: int, weight: float = 1.0) -> FloatArray:
        """Row f + 1 (f = -1..1000, a slot's free milli as the state holds it): the value a
        share of `milli` throws away on a GPU with f free, in GPUs times `weight`; 0 where the
        share does not fit. Kept per (milli, weight): a policy asks once per decision."""

        def make() -> FloatArray:
            free = np.arange(milli, MILLI_PER_GPU + 1)
            loss = self.value[free] - self.value[free - milli] - self.price(milli)
            table = np.zeros(MILLI_PER_GPU + 2, np.float64)
            table[free + 1] = np.round(np.maximum(loss, 0.0), DECIMALS) * weight
            return table

        return kept_per_shape(self._lost, (milli, weight), make)


def best_patterns(
    steps: list[int], prices: FloatArray, capacity: int
) -> tuple[FloatArray, list[int]]:
    """The unbounded knapsack over `capacity` steps: best[c], the most a multiset of the sizes
    (`steps`, each any number of times) fitting in c earns at `prices`, and the pattern that
    earns best[capacity] (a count per size). Plain Python: a few sizes over about a hundred
    steps cost less so than in numpy calls."""
    price = prices.tolist()
    sizes = list(enumerate(steps))
    best = [0.0] * (capacity + 1)
    took = [-1] * (capacity + 1)
    for c in range(1, capacity + 1):
        value, taken = best[c - 1], -1  # what fits c - 1 fits c
        for k, size in sizes:
            if size <= c and best[c - size] + price[k] > value:
                value, taken = best[c - size] + price[k], k
        best[c], took[c] = value, taken
    pattern = [0] * len(steps)
    c = capacity
    while c > 0:
        if took[c] < 0:
            c -= 1
        else:
            pattern[took[c]] += 1
            c -= steps[took[c]]
    return np.array(best, np.float64), pattern


def dual_prices(steps: list[int], demand: list[float], capacity: int) -> FloatArray:
    """y maximising demand . y with y >= 0 and every pattern of `steps` that fits `capacity`
    worth at most 1, by cutting planes (see the module's docstring)."""
    k = len(steps)
    if k == 0:
        return np.zeros(0, np.float64)
    # to start, each size alone as many times as it fits: bounded, and a feasible basis
    cuts = [np.eye(k)[j] * (capacity // steps[j]) for j in range(k)]
    weights = np.array(demand, np.float64)
    prices = np.zeros(k, np.float64)
    for _ in range(MAX_ROUNDS):
        prices = simplex_max(np.array(cuts), weights)
        _, pattern = best_patterns(steps, prices, capacity)
        worth = float(np.dot(pattern, prices))
        if worth <= 1.0 + TOLERANCE:
            return prices
        cuts.append(np.array(pattern, np.float64))
    # not converged (never seen): scaled down, the prices are still feasible
    return prices / max(worth, 1.0)


def simplex_max(rows: FloatArray, weights: FloatArray) -> FloatArray:
    """y >= 0 maximising weights . y subject to rows @ y <= 1 (rows >= 0, every variable in
    some row with a positive coefficient, so the program is bounded and y = 0 is a vertex).

    The tableau method: the most improving variable enters (Dantzig's rule, few pivots), and
    after a run of pivots that do not improve the objective, the lowest index enters and
    leaves (Bland's rule), which cannot cycle. The programs here are a few dozen rows and
    columns."""
    m, k = rows.shape
    table = np.zeros((m + 1, k + m + 1), np.float64)
    table[:m, :k] = rows
    table[:m, k : k + m] = np.eye(m)
    table[:m, -1] = 1.0
    table[m, :k] = -weights
    basis = list(range(k, k + m))
    eps = 1e-12
    stalled = 0
    while True:
        costs = table[m, :-1]
        entering = np.flatnonzero(costs < -eps)
        if entering.size == 0:
            break
        bland = stalled >= STALLED_PIVOTS
        col = int(entering[0]) if bland else int(np.argmin(costs))
        column = table[:m, col]
        rising = np.flatnonzero(column > eps)
        ratios = table[rising, -1] / column[rising]
        tied = rising[ratios <= ratios.min() + eps]
        row = int(min(tied, key=lambda r: basis[r])) if bland else int(tied[0])
        stalled = stalled + 1 if table[row, -1] <= eps else 0
        table[row] /= table[row, col]
        others = np.arange(m + 1) != row
        table[others] -= np.outer(table[others, col], table[row])
        basis[row] = col
    prices = np.zeros(k, np.float64)
    for row, var in enumerate(basis):
        if var < k:
            prices[var] = max(table[row, -1], 0.0)
    return prices


_PRICES: weakref.WeakKeyDictionary[TargetWorkload, SharePrices | None] = weakref.WeakKeyDictionary()


def share_prices(target: TargetWorkload) -> SharePrices | None:
    """The target's SharePrices, made on first use; None when it has no fractional shares."""
    if target in _PRICES:
        return _PRICES[target]
    sizes = share_sizes(target)
    found = _PRICES[target] = SharePrices.of(sizes) if sizes else None
    return found
