"""Each policy's scores on hand-built clusters, the expected values worked out by hand from the
published procedure (FGD_PROCEDURE.md in the benchmark's sources)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.scheduler.helpers import cpu_only, share, small_target, three_nodes, whole

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import GiB
from gpupool.scheduler import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    ClusterState,
    Placement,
    TargetWorkload,
    demand_of,
    fragment_index,
    make_policy,
    place,
)
from gpupool.scheduler.fgd import fragment_options
from gpupool.scheduler.gpupool_policy import GpupoolPolicy, WideIdle, stranded_milli
from gpupool.scheduler.paper import (
    BestFitPolicy,
    ClusteringPolicy,
    DotProdPolicy,
    PackingPolicy,
)
from gpupool.scheduler.workload import PodSpec, WideSize, Widest

ALL = np.arange(3)


def test_dotprod_scores_floor_of_one_minus_half_dot() -> None:
    state = ClusterState(three_nodes())
    request = share(500, cpu=8000)
    # n0: (8000/128000)(32000/128000) + (500/8000)(2000/8000) = 0.03125 -> floor(98.4375)
    # n1: 0.0625 -> floor(96.875); n2: 0.0078125 + 0.0625 -> floor(96.484375)
    assert DotProdPolicy(seed=0).scores(state, request, ALL).tolist() == [98, 96, 96]


def test_bestfit_min_max_normalises_the_integer_scores() -> None:
    state = ClusterState(three_nodes())
    request = share(500, cpu=8000)
    # raw: n0 floor(100 (1 - 0.09375 - 0.09375)) = 81; n1 floor(56.25) = 56; n2 floor(50.0) = 50
    # normalised: (81-50)*100//31 = 100, (56-50)*100//31 = 19, 0
    assert BestFitPolicy(seed=0).scores(state, request, ALL).tolist() == [100, 19, 0]
    assert BestFitPolicy(seed=0).scores(state, request, np.array([1])).tolist() == [0]


def test_packing_idle_nodes_then_shared_gpus_then_free_gpus_on_used_nodes() -> None:
    state = ClusterState(three_nodes())
    policy = PackingPolicy(seed=0)
    # idle nodes: max(33 - GPUs, GPUs)
    assert policy.scores(state, share(500), ALL).tolist() == [31, 29, 25]
    state.allocate(share(300), Placement(1, (0,), 300))
    # n1 uses its 700-free GPU: 100 - (700 * 100 // 1000) // 10 = 93
    assert policy.scores(state, share(500), ALL).tolist() == [31, 93, 25]
    # too big for the shared GPU: one free GPU on a used node, 50 - 1
    assert policy.scores(state, share(800), ALL).tolist() == [31, 49, 25]
    assert policy.scores(state, whole(2), ALL).tolist() == [31, 48, 25]
    assert policy.scores(state, cpu_only(), ALL).tolist() == [0, 0, 0]


def test_clustering_tiers_and_within_tier_order() -> None:
    state = ClusterState(three_nodes())
    policy = ClusteringPolicy(seed=0)
    state.allocate(share(300), Placement(1, (0,), 300))
    # n1 holds only shares: 75 + 25 * (8000 - 3700) // 8000 = 75 + 13
    # empty nodes: 25 + 25 * (8000 - 2000) // 8000 = 43 and 25 + 0
    assert policy.scores(state, share(200), ALL).tolist() == [43, 88, 25]
    # a 1-GPU pod: n1 holds other classes only, tier 0
    assert policy.scores(state, whole(1), ALL).tolist() == [43, 13, 25]
    state.allocate(whole(1), Placement(1, (1,), 1000))
    # mixed classes including shares: 50 + 25 * (8000 - 2700) // 8000 = 50 + 16
    assert policy.scores(state, share(200), ALL).tolist() == [43, 66, 25]
    assert policy.scores(state, cpu_only(), ALL).tolist() == [0, 0, 0]


def test_fgd_fragment_and_score_by_hand() -> None:
    state = ClusterState(three_nodes())
    target = small_target()
    index = fragment_index(state, target)
    # n0 idle: m1 and m2 fit with nothing below their need; m3 (CPU-only) counts all 2000
    assert index.frag[0] == pytest.approx(0.25 * 2000)
    policy = make_policy("fgd", seed=0, target_workload=target)
    first = place(state, share(300), policy)
    assert first is not None and first.gpus == (0,)
    # n0 after [700, 1000]: m1 0, m2 700, m3 1700 -> 600; delta -100 -> int(100 sigmoid(-0.1))
    options = fragment_options(index, share(300), np.array([0]))
    assert options.after[0] == pytest.approx(600.0)
    assert int(100 / (1 + math.exp(0.1))) == 47
    state.allocate(share(300), Placement(0, (0,), 300))
    assert index.frag[0] == pytest.approx(600.0)
    # next 300: GPU 0 -> [400, 1000] F 650; GPU 1 -> [700, 700] F 700; GPU 0 wins
    options = fragment_options(index, share(300), np.array([0]))
    assert options.gpus.tolist() == [0]
    assert options.after[0] == pytest.approx(650.0)


def test_fgd_prefers_the_node_whose_fragment_grows_least() -> None:
    state = ClusterState(three_nodes())
    target = small_target()
    state.allocate(share(500), Placement(2, (4,), 500))
    # a 500 share completes n2's half-used GPU: F drops by 0.5 * 500 + 0.25 * 500 + 0.25 * 500
    placement = place(state, share(500), make_policy("fgd", seed=1, target_workload=target))
    assert placement == Placement(2, (4,), 500)


def test_stranded_milli_is_gpu_that_cpu_or_memory_cannot_feed() -> None:
    target = TargetWorkload(
        specs=(PodSpec(cpu=1000, gpu_milli=1000, gpus=1, gpu_models=()),),
        probabilities=(1.0,),
        cpu_per_gpu_milli=10.0,
        memory_per_gpu_milli=100.0,
    )
    gpu = np.array([2000, 2000, 2000])
    cpu = np.array([10_000, 30_000, 30_000])
    memory = np.array([1_000_000, 1_000_000, 50_000])
    # CPU feeds 1000, 3000, 3000 milli; memory 10000, 10000, 500
    assert stranded_milli(gpu, cpu, memory, target).tolist() == [1000.0, 0.0, 1500.0]


def test_gpupool_avoids_stranding_a_nodes_gpus_for_cpu() -> None:
    state = ClusterState(three_nodes())
    target = TargetWorkload(
        small_target().specs, small_target().probabilities, cpu_per_gpu_milli=12.0
    )
    # FGD sees no change anywhere (every spec still fits); CPU after 10000 taken feeds:
    # n0 22000 / 12 = 1833 of 2000 GPU milli (167 stranded, none before); n1 4500 of 4000;
    # n2 500 of 8000 (7500 stranded, 6667 before). Only n1 strands nothing.
    for seed in range(5):
        policy = make_policy("gpupool", seed=seed, target_workload=target)
        assert place(state, cpu_only(cpu=10_000), policy) == Placement(1, (), 0)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_places_feasibly_and_is_deterministic(name: str) -> None:
    target = small_target()
    requests = [share(300), whole(2), cpu_only(), share(700, models=("A",)), whole(1)] * 4

    def run() -> list[Placement | None]:
        state = ClusterState(three_nodes())
        policy = make_policy(name, seed=7, target_workload=target)
        out = []
        for request in requests:
            placement = place(state, request, policy)
            if placement is not None:
                state.allocate(request, placement)
            out.append(placement)
        return out

    first = run()
    assert first == run()
    assert sum(p is not None for p in first) >= 10


def test_node_order_breaks_ties_and_depends_on_the_seed() -> None:
    # eight identical nodes: every score ties, so the winner is the seed's first node
    nodes = [three_nodes()[0].__class__(f"n{i}", 8000, 0, 1, "A") for i in range(8)]
    winners = set()
    for seed in range(6):
        policy = make_policy("bestfit", seed=seed)
        placement = place(ClusterState(nodes), cpu_only(), policy)
        assert placement is not None
        assert placement.node == int(np.argmin(policy.node_rank(8)))
        winners.add(placement.node)
    assert len(winners) > 1


def test_unknown_policy_lists_the_valid_names() -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_policy("tetris", seed=0)
    message = str(caught.value)
    assert "'tetris'" in message
    assert all(name in message for name in POLICY_NAMES)
    assert DEFAULT_POLICY == "gpupool" and DEFAULT_POLICY in POLICY_NAMES


def test_target_workload_keeps_popular_specs_up_to_coverage() -> None:
    requests = [share(500)] * 6 + [whole(1)] * 3 + [cpu_only()]
    target = TargetWorkload.from_requests(requests, coverage=0.9)
    assert [s.gpu_milli for s in target.specs] == [500, 1000]
    assert target.probabilities == pytest.approx((6 / 9, 3 / 9))
    # 10 pods ask 6 * 500 + 3 * 1000 GPU milli and 10 * 1000 CPU milli
    assert target.cpu_per_gpu_milli == pytest.approx(10_000 / 6000)
    with pytest.raises(InvalidRequest, match="coverage"):
        TargetWorkload.from_requests(requests, coverage=1.5)


def test_binpack_and_spread_pick_opposite_nodes_and_gpus() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(600), Placement(1, (2,), 600))
    state.allocate(share(200), Placement(1, (0,), 200))
    # usage: n0 0 %, n1 20 %, n2 0 %
    binpack = place(state, share(300), make_policy("binpack", seed=0))
    spread = place(state, share(300), make_policy("spread", seed=0))
    assert binpack == Placement(1, (2,), 300)  # fullest node, fullest GPU that fits (400 free)
    assert spread is not None and spread.node in (0, 2)
    assert spread.gpus == (0,)


#: the Alibaba trace's share sizes, per thousand pods (default workload, FGD's 95 % target)
TRACE_SHARES = {810: 139, 470: 96, 650: 31, 320: 39, 230: 16, 460: 15}
TRACE_SHARES |= {590: 10, 550: 9, 160: 7, 370: 6, 220: 6}


def test_gpupool_puts_a_share_where_it_throws_no_packing_value_away() -> None:
    # priced by the packing LP: a 650 leaves a 320's place (350), a 550 a 230's and a 220's
    # (450); a 230 in the 350 wastes the 320's third (less its quarter), beside the 550 nothing.
    # FGD sees less free compute left beside the 650 and goes there.
    target = TargetWorkload(
        tuple(PodSpec(cpu=1000, gpu_milli=m, gpus=1, gpu_models=()) for m in TRACE_SHARES),
        tuple(n / sum(TRACE_SHARES.values()) for n in TRACE_SHARES.values()),
    )
    nodes = [NodeSpec(f"n{i}", 32_000, 64 * GiB, 2, "A") for i in range(3)]
    apart = ClusterState(nodes)
    apart.allocate(share(650), Placement(0, (0,), 650))
    apart.allocate(share(550), Placement(1, (1,), 550))
    together = ClusterState(nodes[:1])  # the same two GPUs on one node
    together.allocate(share(650), Placement(0, (0,), 650))
    together.allocate(share(550), Placement(0, (1,), 550))
    for seed in range(4):
        gpupool = make_policy("gpupool", seed=seed, target_workload=target)
        fgd = make_policy("fgd", seed=seed, target_workload=target)
        assert place(apart, share(230), gpupool) == Placement(1, (1,), 230)
        assert place(apart, share(230), fgd) == Placement(0, (0,), 230)
        assert place(together, share(230), gpupool) == Placement(0, (1,), 230)
        assert place(together, share(230), fgd) == Placement(0, (0,), 230)


def test_gpupool_scores_as_fgd_when_the_target_has_model_bound_specs() -> None:
    bound = TargetWorkload(
        (*small_target().specs, PodSpec(cpu=1000, gpu_milli=1000, gpus=1, gpu_models=("B",))),
        (0.4, 0.2, 0.2, 0.2),
        cpu_per_gpu_milli=12.0,
    )
    pods = [share(300), whole(2), cpu_only(cpu=9000), share(700), whole(1, models=("B",))] * 5

    def decisions(name: str) -> list[Placement | None]:
        state = ClusterState(three_nodes())
        policy = make_policy(name, seed=9, target_workload=bound)
        out = []
        for pod in pods:
            placement = place(state, pod, policy)
            if placement is not None:
                state.allocate(pod, placement)
            out.append(placement)
        return out

    assert decisions("gpupool") == decisions("fgd")


def test_gpupool_keeps_idle_big_nodes_when_the_target_has_multi_gpu_specs() -> None:
    base = small_target()
    # an 8-GPU spec whose CPU fits nowhere: it adds the same fragment change on every node
    eight = PodSpec(cpu=10**9, gpu_milli=1000, gpus=8, gpu_models=())
    with_multi = TargetWorkload((*base.specs, eight), (0.4, 0.2, 0.2, 0.2), cpu_per_gpu_milli=10.0)
    single_only = TargetWorkload(base.specs, base.probabilities, cpu_per_gpu_milli=10.0)
    big = NodeSpec("big", cpu=40_000, host_memory=GiB, gpu_count=8, gpu_model="A")
    small = NodeSpec("small", cpu=15_000, host_memory=GiB, gpu_count=2, gpu_model="A")
    request = whole(1, cpu=0)
    # FGD's decrease is equal on both nodes (400 with the 8-GPU spec, 250 without).
    # Stranded milli before/after: big 4000 -> 3000 (its CPU feeds 4000), small 500 -> 0.
    for seed in range(4):
        keep = make_policy("gpupool", seed=seed, target_workload=with_multi)
        # big is idle and fits the 8-GPU spec: no reward there, 400 vs 400 + 0.5 * 500
        assert place(ClusterState([big, small]), request, keep) == Placement(1, (0,), 1000)
        reward = make_policy("gpupool", seed=seed, target_workload=single_only)
        # no multi-GPU spec: big earns 250 + 0.5 * 1000 against 250 + 0.5 * 500
        assert place(ClusterState([big, small]), request, reward) == Placement(0, (0,), 1000)


def test_gpupool_keeps_the_last_idle_nodes_that_can_take_the_widest_pod() -> None:
    # n0: 8 GPUs and the CPU for the widest pod; n1: 8 GPUs, too little CPU for it
    nodes = [
        NodeSpec("n0", cpu=128_000, host_memory=512 * GiB, gpu_count=8, gpu_model="A"),
        NodeSpec("n1", cpu=64_000, host_memory=512 * GiB, gpu_count=8, gpu_model="A"),
    ]
    wide = Request(gpus=8, compute=1000, cpu=120_000, host_memory=64 * GiB)
    small = whole(1, cpu=1000)
    # one wide pod in 201: too rare for the per-size reserve (2 x 15.5 / 201 < 1 node), so n0
    # is kept by the RESERVED_NODES rule alone
    target = TargetWorkload.from_requests([small] * 200 + [wide])
    assert target.widest.gpus == 8 and target.widest.cpu == 120_000
    policy = make_policy("gpupool", seed=0, target_workload=target)
    assert isinstance(policy, GpupoolPolicy)
    assert policy.kept_by_size(ClusterState(nodes), demand_of(small)) is None
    for seed in range(6):  # whatever the node order, the small pod leaves n0 whole
        placement = place(
            ClusterState(nodes), small, make_policy("gpupool", seed=seed, target_workload=target)
        )
        assert placement is not None and placement.node == 1
    # when only n0 can take it, it goes there all the same
    full = ClusterState(nodes)
    full.allocate(whole(8, cpu=1000), Placement(1, tuple(range(8)), 1000))
    placement = place(full, small, make_policy("gpupool", seed=0, target_workload=target))
    assert placement is not None and placement.node == 0


def test_gpupool_keeps_idle_nodes_for_each_size_of_the_widest_pods_as_many_are_expected() -> None:
    base = small_target()
    big = NodeSpec("big", cpu=64_000, host_memory=GiB, gpu_count=8, gpu_model="A")
    small = NodeSpec("small", cpu=15_000, host_memory=GiB, gpu_count=2, gpu_model="A")

    def target(share_64: float) -> TargetWorkload:
        # widest pods: 8 GPUs with 120 cores (no node takes them) or with 64 cores (big does)
        sizes = (WideSize(120_000, 0, share_64 / 2), WideSize(64_000, 0, share_64))
        return TargetWorkload(
            base.specs,
            base.probabilities,
            cpu_per_gpu_milli=10.0,
            widest=Widest(8, 120_000, 0, sizes),
            gpu_milli_per_pod=1000.0,
        )

    request = whole(1, cpu=0)
    # Without a reserve big wins (stranding reward 500 against 250, as above). The free GPUs
    # (10,000 milli at 1,000 per pod) expect 10 pods; 10 % of them 8-GPU pods of 64 cores or
    # more: 2 x 1 = 2 >= 1 able node, so big is kept; at 1 %, 0.2 < 1, it is not.
    for seed in range(4):
        kept = make_policy("gpupool", seed=seed, target_workload=target(0.1))
        assert place(ClusterState([big, small]), request, kept) == Placement(1, (0,), 1000)
        free = make_policy("gpupool", seed=seed, target_workload=target(0.01))
        assert place(ClusterState([big, small]), request, free) == Placement(0, (0,), 1000)
    # a pod of that size is what the node is kept for
    policy = make_policy("gpupool", seed=0, target_workload=target(0.1))
    assert isinstance(policy, GpupoolPolicy)
    state = ClusterState([big, small])
    assert policy.kept_by_size(state, demand_of(whole(8, cpu=64_000))) is None
    assert policy.kept_by_size(state, demand_of(whole(8, cpu=32_000))) is not None
    # once only big has room, the pod goes there all the same
    state.allocate(demand_of(whole(2, cpu=0)), Placement(1, (0, 1), 1000))
    assert place(state, request, kept) == Placement(0, (0,), 1000)


def test_target_workload_counts_the_widest_pods_by_cpu_size() -> None:
    pods = [whole(1)] * 6 + [whole(8, cpu=64_000), whole(8, cpu=64_000), whole(8, cpu=120_000)]
    pods.append(whole(8, cpu=88_000, memory=8 * GiB))
    target = TargetWorkload.from_requests(pods)
    assert target.widest.sizes == (
        WideSize(120_000, 0, 0.1),
        WideSize(88_000, 8 * GiB, 0.2),
        WideSize(64_000, 0, 0.4),
    )
    assert target.gpu_milli_per_pod == (6 + 4 * 8) * 1000 / 10
    assert TargetWorkload.from_requests([whole(1)] * 3).widest.sizes == ()


def test_the_idle_wide_nodes_follow_every_change_of_the_state() -> None:
    nodes = [
        NodeSpec(f"n{i}", cpu=cpu, host_memory=512 * GiB, gpu_count=gpus, gpu_model="A")
        for i, (cpu, gpus) in enumerate([(128_000, 8), (96_000, 8), (64_000, 8), (96_000, 4)])
    ]
    sizes = (WideSize(120_000, 0, 0.01), WideSize(64_000, 64 * GiB, 0.02))
    state = ClusterState(nodes)
    wide = WideIdle(state, 8, sizes)
    assert wide.counts == [1, 3]
    state.observer("wide", lambda: wide)
    steps = [
        (cpu_only(cpu=40_000), Placement(0, (), 0)),  # n0 keeps its GPUs, loses the 120 cores
        (whole(1, cpu=0), Placement(1, (3,), 1000)),  # n1 is no longer idle
        (whole(2, cpu=0), Placement(3, (0, 1), 1000)),  # a 4-GPU node never counts
    ]
    for request, placement in steps:
        state.allocate(request, placement)
        fresh = WideIdle(state, 8, sizes)
        assert wide.counts == fresh.counts and (wide.able == fresh.able).all()
    assert wide.counts == [0, 2]
    for request, placement in reversed(steps):
        state.release(request, placement)
    assert wide.counts == [1, 3]
