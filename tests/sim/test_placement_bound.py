"""The placement bound (bench/placement_bound.py): never above what a placement can reach, and
equal to it on small clusters whose optimum is known."""

from __future__ import annotations

import importlib
import math
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpupool.core.resources import NodeSpec, Request
from gpupool.scheduler import ClusterState, demand_of
from gpupool.scheduler.state import Placement
from gpupool.sim import procedure, synthetic, trace
from gpupool.sim.runner import RunSpec, Scenario, run_one

BENCH = Path(__file__).resolve().parents[2] / "bench"
GiB = 2**30


def load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:  # the bench imports its LP module beside it
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def lp() -> ModuleType:
    return load("placement_bound_lp")


def node(name: str, gpus: int, cpu: int = 64_000, memory: int = 256, model: str = "A") -> NodeSpec:
    return NodeSpec(name=name, cpu=cpu, host_memory=memory * GiB, gpu_count=gpus, gpu_model=model)


def pod(
    milli: int, gpus: int = 1, cpu: int = 1000, memory: int = 1, models: tuple[str, ...] = ()
) -> Request:
    return Request(
        name=f"p{random.random()}",
        cpu=cpu,
        host_memory=memory * GiB,
        gpus=gpus,
        compute=milli,
        gpu_models=models,
    )


def optimum(nodes: list[NodeSpec], pods: list[Request]) -> int:
    """The most GPU milli any placement of a subset of `pods` allocates, by trying them all
    with the replay's own state (its fit checks and its GPU accounting)."""
    state = ClusterState(nodes)
    demands = [demand_of(p) for p in pods]

    def best(i: int) -> int:
        if i == len(demands):
            return state.allocated_gpu_milli
        found = best(i + 1)  # left out
        demand = demands[i]
        for n in range(len(nodes)):
            if not state.feasible(demand)[n]:
                continue
            choices: list[tuple[int, ...]] = (
                [(int(g),) for g in state.fitting_gpus(n, demand)]
                if demand.is_fractional
                else [state.best_gpu_placement(n, demand).gpus]
            )
            for gpus in choices:
                placement = Placement(n, gpus, demand.compute)
                state.allocate(demand, placement)
                found = max(found, best(i + 1))
                state.release(demand, placement)
        return found

    return best(0)


KNOWN = {
    "shares pair up on a GPU": ([node("a", 2)], [pod(700), pod(300), pod(400), pod(600)], 2000),
    "810s waste their GPU's rest": ([node("a", 2)], [pod(810)] * 3, 1620),
    "three 600s on two GPUs": ([node("a", 2)], [pod(600)] * 3, 1200),
    "CPU holds one whole-GPU pod per node": (
        [node("a", 2, cpu=10_000)],
        [pod(1000, cpu=6000)] * 2,
        1000,
    ),
    "two of three 40-45 % CPU pods per node": (
        [node("a", 4, cpu=100_000)],
        [pod(1000, cpu=40_000), pod(1000, cpu=40_000), pod(1000, cpu=45_000)],
        2000,
    ),
    "memory holds one share per node": (
        [node("a", 1, memory=10), node("b", 1, memory=10)],
        [pod(300, memory=6)] * 3,
        600,
    ),
    "a model no node has": ([node("a", 2)], [pod(1000, models=("B",))], 0),
    "a model on one node only": (
        [node("a", 2, model="A"), node("b", 2, model="B")],
        [pod(1000, gpus=2, models=("A",))] * 2 + [pod(500, models=("B",))] * 5,
        4000,
    ),
    "more GPUs than a node has": ([node("a", 2), node("b", 2)], [pod(1000, gpus=4)], 0),
}


@pytest.mark.parametrize("case", KNOWN)
def test_bound_equals_the_known_optimum(lp: ModuleType, case: str) -> None:
    nodes, pods, best = KNOWN[case]
    assert optimum(nodes, pods) == best
    assert lp.placement_bound(nodes, pods).upper == pytest.approx(best, abs=1e-6)


def random_case(rng: random.Random) -> tuple[list[NodeSpec], list[Request]]:
    nodes = [
        node(f"n{i}", rng.choice([1, 2]), cpu=rng.choice([8000, 16000]), model=rng.choice("AB"))
        for i in range(2)
    ]
    pods = []
    for _ in range(5):
        gpus = rng.choice([1, 1, 1, 2])
        milli = 1000 if gpus > 1 else rng.choice([200, 300, 500, 700, 810, 1000])
        models = rng.choice([(), (), ("A",), ("B",)])
        pods.append(pod(milli, gpus, cpu=rng.choice([1000, 4000, 7000]), models=models))
    return nodes, pods


@pytest.mark.parametrize("seed", range(12))
def test_bound_is_never_below_the_optimum(lp: ModuleType, seed: int) -> None:
    nodes, pods = random_case(random.Random(seed))
    assert lp.placement_bound(nodes, pods).upper >= optimum(nodes, pods) - 1e-6


def test_best_pattern_is_the_knapsack_optimum(lp: ModuleType) -> None:
    worth, pattern = lp.best_pattern([300, 450, 810], [1.0, 2.0, 3.5])
    assert worth == pytest.approx(4.0)  # 450 + 450 beats 810 alone (3.5) and 3 x 300 (3.0)
    assert pattern == {450: 2}


def test_bound_is_below_every_replay_of_the_synthetic_cluster() -> None:
    bench = load("placement_bound")
    nodes = synthetic.synthetic_nodes(synthetic.DEFAULT_SCALE)
    pods = synthetic.synthetic_workload(synthetic.DEFAULT_SCALE)
    order = procedure.arrival_order(pods, trace.cluster_gpu_milli(nodes), 42)
    runs = [
        run_one(Scenario(), RunSpec(synthetic.SYNTHETIC_WORKLOAD, policy, 42)).curves
        for policy in ("gpupool", "fgd", "packing")
    ]
    for pct in (90, 100, 110, 130):
        bound, _ = bench.bound_at(nodes, order, pct)
        assert 0 <= bound <= min(run.at(pct) for run in runs) + 1e-9
        assert bound >= 100 - pct - 1  # never below the ideal (arrived milli) by more than a bin


def test_must_place_forces_every_pod_of_a_size_in(lp: ModuleType) -> None:
    nodes, pods = [node("a", 1)], [pod(810), pod(1000)]
    assert lp.placement_bound(nodes, pods).upper == pytest.approx(1000)
    forced = lp.placement_bound(nodes, pods, must_place=frozenset({810}))
    assert forced.upper == pytest.approx(810)
    assert math.isnan(lp.placement_bound(nodes, [pod(810)] * 2, frozenset({810})).upper)


def test_explain_names_the_pods_left_out_and_the_part_filled_gpus(lp: ModuleType) -> None:
    bench = load("placement_bound")
    result = lp.placement_bound([node("a", 2)], [pod(810)] * 3)
    lines = bench.explain("tiny", result, 2000)
    assert "  1 x 810: 40.500" in lines  # one 810 left out: 810 of 2000 milli
    assert "  64, 256, 2, A: 0.000, 19.000" in lines  # two GPUs, 190 idle on each
