"""The paper's arrival procedure: shuffle by seed, inflate to 130 % with clones, or trim."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.sim.procedure import arrival_order, gpu_milli_limit


def pods(*milli: int) -> list[Request]:
    """One-GPU pods (fractional below 1000) plus, for 0, CPU-only pods; named in order."""
    return [
        Request(name=f"pod-{i:03d}", cpu=1000, gpus=1 if m else 0, compute=m or 1000)
        for i, m in enumerate(milli)
    ]


def total(order: list[Request]) -> int:
    return sum(p.total_gpu_milli for p in order)


def test_inflation_stops_before_the_next_clone_passes_130_percent() -> None:
    originals = pods(*([300, 700, 1000, 0] * 25))  # 50 GPUs asked of a 60-GPU cluster
    cluster = 60_000
    order = arrival_order(originals, cluster, seed=42)
    limit = gpu_milli_limit(cluster)
    assert limit == 78_000
    assert total(order) <= limit
    # the largest pod is 1000 milli: had a clone fitted, the loop would not have stopped
    assert total(order) > limit - 1000
    clones = order[len(originals) :]
    assert clones and all("-clone-" in p.name for p in clones)
    assert len({p.name for p in order}) == len(order), "clone names are distinct"


def test_originals_come_first_shuffled_then_the_clones() -> None:
    originals = pods(*range(100, 1000, 10))
    order = arrival_order(originals, 50_000, seed=1)
    head = order[: len(originals)]
    assert sorted(p.name for p in head) == [p.name for p in originals]
    assert [p.name for p in head] != [p.name for p in originals], "shuffled"


def test_same_seed_same_order_whatever_the_input_order() -> None:
    originals = pods(*range(100, 1000, 10))
    first = arrival_order(originals, 50_000, seed=7)
    second = arrival_order(list(reversed(originals)), 50_000, seed=7)
    assert [p.name for p in first] == [p.name for p in second]
    other = arrival_order(originals, 50_000, seed=8)
    assert [p.name for p in first] != [p.name for p in other]


def test_a_workload_above_130_percent_is_trimmed_by_random_drops() -> None:
    originals = pods(*([1000] * 200))  # 200 GPUs asked of 100
    order = arrival_order(originals, 100_000, seed=3)
    assert total(order) == 130_000
    assert not any("-clone-" in p.name for p in order)
    names = [p.name for p in order]
    assert names != sorted(names)[: len(names)], "the dropped pods are random, not the last"


def test_a_workload_exactly_at_the_limit_is_kept_whole() -> None:
    originals = pods(*([1000] * 13))
    order = arrival_order(originals, 10_000, seed=3)
    assert len(order) == 13


def test_a_workload_without_gpu_demand_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="no GPU"):
        arrival_order(pods(0, 0), 10_000, seed=1)


def test_an_empty_workload_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="empty workload"):
        arrival_order([], 10_000, seed=1)
