"""The packing LP's prices and the value a share throws away (scheduler/packing.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from gpupool.scheduler.packing import (
    MAX_PRICED,
    SharePrices,
    best_patterns,
    share_prices,
    share_sizes,
    simplex_max,
)
from gpupool.scheduler.workload import PRIOR, PodSpec, TargetWorkload


def patterns(sizes: list[int], capacity: int = 1000) -> list[tuple[int, ...]]:
    """Every multiset of `sizes` (a count per size) that fits `capacity`, by brute force."""
    ranges = [range(capacity // s + 1) for s in sizes]
    return [
        counts
        for counts in itertools.product(*ranges)
        if any(counts) and sum(c * s for c, s in zip(counts, sizes, strict=True)) <= capacity
    ]


def lp_optimum(sizes: dict[int, float]) -> float:
    """The fractional bin-packing optimum (GPUs per unit of the mix), by an independent solver
    over every pattern."""
    ordered = sorted(sizes)
    columns = np.array(patterns(ordered), np.float64).T
    demand = np.array([sizes[s] for s in ordered])
    result = linprog(
        np.ones(columns.shape[1]), A_ub=-columns, b_ub=-demand, bounds=(0, None), method="highs"
    )
    assert result.status == 0
    return float(result.fun)


def test_the_traces_mix_is_priced_as_it_packs() -> None:
    # the Alibaba trace's share sizes and frequencies (default workload, FGD's 95 % target)
    mix = {810: 0.139, 470: 0.096, 650: 0.031, 320: 0.039, 230: 0.016, 460: 0.015}
    mix |= {590: 0.010, 550: 0.009, 160: 0.007, 370: 0.006, 220: 0.006}
    prices = SharePrices.of(mix)
    expected = {810: 1, 470: 1 / 2, 460: 1 / 2, 650: 2 / 3, 550: 2 / 3, 590: 2 / 3}
    expected |= {320: 1 / 3, 370: 1 / 3, 230: 1 / 4, 220: 1 / 12, 160: 0}
    assert prices.prices == pytest.approx(expected, abs=1e-9)
    assert sum(mix[s] * y for s, y in prices.prices.items()) == pytest.approx(lp_optimum(mix))
    # a 230 in a 650's 350 leaves 120 that nothing priced fills: it loses the 320's third
    # less its own quarter; beside a 550 (450 free) it leaves a 220's place and loses nothing
    lost = prices.lost(230)
    assert lost[350 + 1] == pytest.approx(1 / 3 - 1 / 4)
    assert lost[450 + 1] == 0.0
    # an 810 on an idle GPU is a whole GPU's worth; a 470 beside another 470 loses nothing
    assert prices.lost(810)[1000 + 1] == 0.0 and prices.lost(470)[530 + 1] == 0.0
    # where the share does not fit (and on no GPU, row 0) nothing is charged
    assert not lost[: 230 + 1].any()


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([50, 110, 160, 200, 250, 300, 333, 350, 400, 470, 500, 650, 810, 990]),
        st.floats(0.01, 1.0),
        min_size=1,
        max_size=4,
    )
)
def test_prices_are_the_lp_dual_optimum(mix: dict[int, float]) -> None:
    prices = SharePrices.of(mix)
    y = np.array([prices.prices[s] for s in sorted(mix)])
    assert (y >= 0).all()
    # feasible: no pattern is worth more than a GPU
    worth = max(np.dot(counts, y) for counts in patterns(sorted(mix)))
    assert worth <= 1 + 1e-9
    # optimal: the mix's worth is the packing LP's optimum (strong duality)
    assert sum(mix[s] * prices.prices[s] for s in mix) == pytest.approx(lp_optimum(mix), rel=1e-7)
    # V(g) is the best pattern within g, and no placement gains value
    for milli in mix:
        assert (prices.lost(milli) >= 0).all()
    assert prices.value[1000] == pytest.approx(1.0)


def test_a_size_outside_the_mix_is_worth_the_best_pattern_within_it() -> None:
    prices = SharePrices.of({250: 1.0, 500: 1.0})
    assert prices.prices == pytest.approx({250: 0.25, 500: 0.5})
    assert prices.price(300) == pytest.approx(0.25)
    lost = prices.lost(300)
    # exactly its size left: nothing lost; on an idle GPU the 700 left holds only a 500 and
    # 250s: half a GPU and a quarter earned of the whole one
    assert lost[300 + 1] == 0.0
    assert lost[1000 + 1] == pytest.approx(0.25)


def test_the_knapsack_finds_the_most_valuable_pattern() -> None:
    best, pattern = best_patterns([47, 32, 23], np.array([0.5, 1 / 3, 0.25]), 100)
    assert best[100] == pytest.approx(1.0) and best[46] == pytest.approx(0.5)
    assert sum(c * s for c, s in zip(pattern, [47, 32, 23], strict=True)) <= 100
    assert np.dot(pattern, [0.5, 1 / 3, 0.25]) == pytest.approx(1.0)


def test_simplex_solves_a_small_program() -> None:
    # max x + y subject to x + 2y <= 1 and 3x + y <= 1: at x = 1/5, y = 2/5
    solution = simplex_max(np.array([[1.0, 2.0], [3.0, 1.0]]), np.array([1.0, 1.0]))
    assert solution == pytest.approx([0.2, 0.4])


def test_prices_come_from_the_targets_one_gpu_shares_and_are_kept_per_target() -> None:
    target = TargetWorkload(
        (
            PodSpec(4000, 500, 1, ()),
            PodSpec(4000, 500, 1, (), memory=1),  # same size: frequencies add up
            PodSpec(4000, 1000, 1, ()),  # whole GPUs and wider pods are no shares
            PodSpec(4000, 300, 2, ()),
            PodSpec(4000, 0, 0, ()),
        ),
        (0.2, 0.1, 0.3, 0.2, 0.2),
    )
    assert share_sizes(target) == pytest.approx({500: 0.3})
    assert share_prices(target) is share_prices(target)
    no_shares = TargetWorkload((PodSpec(4000, 1000, 1, ()),), (1.0,))
    assert share_prices(no_shares) is None
    prior = share_prices(PRIOR)
    assert prior is not None and set(prior.prices) == {250, 500}


def test_only_the_most_frequent_sizes_are_priced_the_rest_by_what_fits_in_them() -> None:
    # a window of 20 odd sizes (what any user may submit): the 16 most frequent are priced
    sizes = [101 + 37 * i for i in range(20)]
    specs = tuple(PodSpec(0, milli, 1, ()) for milli in sizes)
    weights = tuple(float(20 - i) for i in range(20))
    target = TargetWorkload(specs, tuple(w / sum(weights) for w in weights))
    assert list(share_sizes(target)) == sizes[:MAX_PRICED]
    prices = share_prices(target)
    assert prices is not None and set(prices.prices) == set(sizes[:MAX_PRICED])
    rare = sizes[-1]
    assert prices.price(rare) == prices.value[rare]
