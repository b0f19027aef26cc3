"""The engine's rules beyond the paper's: random's draw, GPUs of several models, memory and
health per GPU (live nodes), the live target workload, and node scores as extender priorities."""

from __future__ import annotations

import numpy as np
import pytest
from tests.scheduler.helpers import share, three_nodes

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import GiB
from gpupool.k8s.fleet import priorities
from gpupool.scheduler import ClusterState, Placement, fragment_index, make_policy, place
from gpupool.scheduler.gpu_placement import node_state
from gpupool.scheduler.gpus import GpuRequest, GpuView
from gpupool.scheduler.packing import share_prices
from gpupool.scheduler.recent import MAX_SHAPES, PRIOR_WEIGHT, RecentShapes
from gpupool.scheduler.state import GpuSlots
from gpupool.scheduler.workload import PRIOR, PodSpec, TargetWorkload, WideSize, Widest, spec_of


def test_random_takes_only_feasible_nodes_and_reaches_each_of_them() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(800), Placement(0, (0,), 800))
    state.allocate(share(800), Placement(0, (1,), 800))  # n0 cannot take a 500 share now
    seen = set()
    for seed in range(40):
        placement = place(state, share(500), make_policy("random", seed=seed))
        assert placement is not None and placement.node != 0
        seen.add((placement.node, placement.gpus))
    assert {node for node, _ in seen} == {1, 2}
    assert len({gpus for node, gpus in seen if node == 2}) > 2  # a random fitting GPU


def two_model_node() -> ClusterState:
    """One node: slots 0-1 model A (24 GiB), slot 2 model B (80 GiB), slot 3 absent."""
    slots = GpuSlots(
        np.array([[0, 0, 1, -1]]),
        np.array([[24 * GiB, 24 * GiB, 80 * GiB, 0]]),
        np.array([[True, True, True, False]]),
        ("A", "B"),
    )
    return ClusterState.of_gpus([NodeSpec("n", 0, 0, 0)], slots)


def test_models_and_memory_are_judged_per_gpu() -> None:
    state = two_model_node()
    assert state.feasible(GpuRequest(1, 100, None, ("B",)))[0]
    assert not state.feasible(GpuRequest(2, 100, None, ("B",)))[0]
    assert not state.feasible(GpuRequest(1, 100, 30 * GiB, ("A",)))[0]
    for name in ("binpack", "spread", "fgd", "gpupool", "bestfit"):
        chosen = place(state, GpuRequest(1, 100, 30 * GiB), make_policy(name, seed=0))
        assert chosen is not None and chosen.gpus == (2,), name  # only B has 30 GiB
    with pytest.raises(InvalidRequest, match="no GPU 3"):
        state.allocate(GpuRequest(1, 100), Placement(0, (3,), 100))


def test_an_unhealthy_gpu_takes_nothing_and_is_no_fragment() -> None:
    healthy = node_state([GpuView.idle(0, "A", 40 * GiB), GpuView.idle(1, "A", 40 * GiB)])
    broken = node_state(
        [GpuView.idle(0, "A", 40 * GiB), GpuView.idle(1, "A", 40 * GiB, healthy=False)]
    )
    assert int(broken.gpu_free_total[0]) == 1000 and int(healthy.gpu_free_total[0]) == 2000
    assert not broken.feasible(GpuRequest(2, 100))[0]
    target = TargetWorkload((spec_of(GpuRequest(1, 1000)),), (1.0,))
    assert fragment_index(broken, target).total == 0.0


def test_binpack_and_spread_break_compute_ties_by_memory() -> None:
    gpus = [
        GpuView(0, "A", 40 * GiB, 30 * GiB, 500),
        GpuView(1, "A", 40 * GiB, 10 * GiB, 500),
        GpuView(2, "A", 40 * GiB, 20 * GiB, 500),
    ]
    request = GpuRequest(1, 100, 1 * GiB)
    state = node_state(gpus)
    assert place(state, request, make_policy("binpack", seed=0)) == Placement(0, (1,), 100)
    assert place(state, request, make_policy("spread", seed=0)) == Placement(0, (0,), 100)


@pytest.mark.parametrize("name", ["fgd", "gpupool"])
def test_fragment_policies_keep_the_gpu_that_has_memory_for_the_target(name: str) -> None:
    # target: 300-milli shares of 20 GiB. GPU 0 has the memory for one; GPU 1 has too little
    # memory for any, so a small share there strands nothing the target could use
    gpus = [GpuView(0, "A", 40 * GiB, 24 * GiB, 700), GpuView(1, "A", 40 * GiB, 6 * GiB, 700)]
    target = TargetWorkload((spec_of(GpuRequest(1, 300, 20 * GiB)),), (1.0,))
    chosen = place(
        node_state(gpus),
        GpuRequest(1, 200, 5 * GiB),
        make_policy(name, seed=0, target_workload=target),
    )
    assert chosen == Placement(0, (1,), 200)


def test_recent_shapes_decay_from_the_prior_and_stay_bounded() -> None:
    recent = RecentShapes()
    assert recent.target().specs == PRIOR.specs
    assert sum(recent.weights.values()) == pytest.approx(PRIOR_WEIGHT)
    for _ in range(200):
        recent.add(GpuRequest(2, 1000))
    top = recent.target()
    assert top.specs[0] == spec_of(GpuRequest(2, 1000)) and top.probabilities[0] > 0.8
    for milli in range(1, 200):
        recent.add(GpuRequest(1, milli))
    assert len(recent.weights) <= MAX_SHAPES
    again = RecentShapes.from_json(recent.to_json())
    assert again.weights == pytest.approx(recent.weights)


def bad_spec(cpu: str) -> str:
    return f'[{{"cpu": {cpu}, "gpu_milli": 500, "gpus": 1, "gpu_models": [], "weight": 1}}]'


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        "[1]",
        '[{"weight": -1}]',
        '[{"cpu": 1}]',
        bad_spec('"x"'),
        bad_spec("-5"),
        bad_spec("true"),
    ],
)
def test_a_bad_saved_window_is_refused_with_one_line(text: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid saved target workload"):
        RecentShapes.from_json(text)


def test_policy_scores_become_extender_priorities_best_ten() -> None:
    assert priorities(np.array([3.0, 1.0, 2.0])).tolist() == [10, 0, 5]
    assert priorities(np.array([7.0, 7.0])).tolist() == [10, 10]
    assert priorities(np.array([])).tolist() == []


def test_recent_shapes_count_the_widest_by_cpu_and_the_gpu_milli_per_pod() -> None:
    one = spec_of(GpuRequest(1, 500))
    four_small = spec_of(Request(gpus=4, compute=1000, cpu=8000))
    four_big = spec_of(Request(gpus=4, compute=1000, cpu=32000))
    target = RecentShapes({one: 6.0, four_small: 3.0, four_big: 1.0}).target()
    assert target.widest == Widest(4, 32000, 0, (WideSize(32000, 0, 0.1), WideSize(8000, 0, 0.4)))
    assert target.gpu_milli_per_pod == pytest.approx((6 * 500 + 4 * 4000) / 10)
    assert RecentShapes().target().widest.sizes == ()  # the prior: one GPU at most


def test_a_gpu_holds_a_spec_exactly_when_its_model_compute_and_memory_allow() -> None:
    """The fragment index's holding test (table look-ups by free milli and, per GPU kind, by
    sorted memory needs) against the definition, GPU by GPU and spec by spec, at the edges."""
    models = np.array([[0, 0, 1, -1], [0, 1, 1, 0]])
    totals = np.array([[24 * GiB, 80 * GiB, 40 * GiB, 0], [24 * GiB, 40 * GiB, 40 * GiB, 80 * GiB]])
    usable = np.array([[True, True, True, False], [True, False, True, True]])
    state = ClusterState.of_gpus(
        [NodeSpec("a", 0, 0, 0), NodeSpec("b", 0, 0, 0)],
        GpuSlots(models, totals, usable, ("A", "B")),
    )
    specs = (
        PodSpec(0, 300, 1, ()),
        PodSpec(0, 1000, 1, ("B",)),
        PodSpec(0, 500, 1, (), memory=20 * GiB),
        PodSpec(0, 500, 1, (), memory=20 * GiB),  # equal needs: both held or neither
        PodSpec(0, 250, 1, ("A",), memory_share=0.5),
        PodSpec(0, 400, 1, (), proportional=True),
        PodSpec(0, 0, 0, ()),
    )
    index = fragment_index(state, TargetWorkload(specs, (1 / len(specs),) * len(specs)))
    rng = np.random.default_rng(7)
    nodes = np.repeat([0, 1], 4 * 40)
    slots = np.tile(np.repeat(np.arange(4), 40), 2)
    total = totals[nodes, slots]
    edges = np.array([-1, 0, 250, 299, 300, 400, 500, 999, 1000])
    # free milli at the specs' edges or anywhere; free memory at a need, a byte either side
    free = np.where(
        rng.random(nodes.size) < 0.5,
        rng.choice(edges, nodes.size),
        rng.integers(0, 1001, nodes.size),
    )
    needs = [
        [
            t * s.gpu_milli // 1000 if s.proportional else s.memory + int(t * s.memory_share)
            for s in specs
        ]
        for t in total
    ]
    memory = np.array([need[rng.integers(len(specs))] + rng.integers(-1, 2) for need in needs])
    held = index.holds(nodes, slots, free, memory)
    for k in range(nodes.size):
        model = (
            state.model_names[models[nodes[k], slots[k]]]
            if models[nodes[k], slots[k]] >= 0
            else None
        )
        for m, spec in enumerate(specs):
            expected = (
                bool(usable[nodes[k], slots[k]])
                and model is not None
                and spec.gpus > 0
                and (not spec.gpu_models or model in spec.gpu_models)
                and free[k] >= spec.gpu_milli
                and memory[k] >= needs[k][m]
            )
            assert held[k, m] == expected, (k, m, free[k], memory[k], needs[k][m])
    assert held.any() and not held.all()


def test_the_target_shown_prices_each_share_in_gpus() -> None:
    recent = RecentShapes()
    for _ in range(40):
        recent.add(GpuRequest(1, 650))
        recent.add(GpuRequest(1, 320))
    prices = share_prices(recent.target())
    shown = {shape["gpu_milli"]: shape for shape in recent.describe(prices=prices)}
    # a 650 and a 320 fill a GPU together: the LP prices them so they add up to one
    assert shown[650]["gpu_value"] + shown[320]["gpu_value"] == pytest.approx(1.0)
    assert "gpu_value" not in shown[1000]  # a whole GPU is no share
    assert all("gpu_value" not in shape for shape in recent.describe())  # no prices, none shown
