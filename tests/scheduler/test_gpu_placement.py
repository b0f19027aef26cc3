"""Live placement on one node's GPUs: memory and models per GPU, N-GPU shares, why not, never."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidRequest, Unschedulable
from gpupool.core.units import GiB, MemoryShare
from gpupool.scheduler import POLICY_NAMES, fragment_index
from gpupool.scheduler.gpu_placement import check_possible, never_fits, node_state, place
from gpupool.scheduler.gpus import GpuRequest, GpuView, take
from gpupool.scheduler.workload import TargetWorkload, spec_of


def target_of(*weighted: tuple[GpuRequest, float]) -> TargetWorkload:
    return TargetWorkload(
        tuple(spec_of(request) for request, _ in weighted), tuple(w for _, w in weighted)
    )


def fragment(node: tuple[GpuView, ...], target: TargetWorkload) -> float:
    """F of the node for `target`, from the engine's fragment index."""
    return fragment_index(node_state(node), target).total


def mixed_node() -> tuple[GpuView, ...]:
    """The simulated spec `4xA30,2xA100-40GB` as one node."""
    a30 = [GpuView.idle(i, "A30", 24 * GiB) for i in range(4)]
    a100 = [GpuView.idle(i, "A100-40GB", 40 * GiB) for i in (4, 5)]
    return (*a30, *a100)


def test_two_20gib_shares_never_land_on_one_24gib_gpu() -> None:
    node = tuple(GpuView.idle(i, "A30", 24 * GiB) for i in range(2))
    request = GpuRequest(1, 300, 20 * GiB)
    first = place(request, node)
    assert first.gpus == (0,)
    node = take(node, request, first.gpus)
    second = place(request, node)
    assert second.gpus == (1,)
    node = take(node, request, second.gpus)
    third = place(request, node)
    assert not third.fits
    assert [str(s) for s in third.why_not] == [
        "GPU 0: memory 20GiB needed, 4GiB free",
        "GPU 1: memory 20GiB needed, 4GiB free",
        "1 GPU needed, 0 can take the share now",
    ]


def test_fraction_resolves_per_gpu_and_absolute_bytes_filter_small_gpus() -> None:
    node = mixed_node()
    half = GpuRequest(1, 100, MemoryShare(fraction=0.5))
    assert half.memory_on(node[0]) == 12 * GiB
    assert half.memory_on(node[4]) == 20 * GiB
    big = GpuRequest(2, 500, 30 * GiB)
    assert place(big, node).gpus == (4, 5)
    assert never_fits(GpuRequest(3, 500, 30 * GiB), node) is not None


def test_memory_defaults_to_the_compute_fraction() -> None:
    gpu = GpuView.idle(0, "A30", 24 * GiB)
    assert GpuRequest(1, 250).memory_on(gpu) == 6 * GiB


def test_models_constrain_every_gpu() -> None:
    node = mixed_node()
    request = GpuRequest(2, 1000, None, ("A100-40GB",))
    assert place(request, node).gpus == (4, 5)
    node = take(node, GpuRequest(1, 500, None, ("A100-40GB",)), [4])
    result = place(request, node)
    assert not result.fits
    whats = {(s.gpu, s.what) for s in result.why_not}
    assert (4, "compute") in whats and (0, "model") in whats and (5, "compute") not in whats


def test_unhealthy_gpu_is_never_chosen_and_says_so() -> None:
    node = (GpuView(0, "A30", 24 * GiB, 24 * GiB, healthy=False), GpuView.idle(1, "A30", 24 * GiB))
    assert place(GpuRequest(1, 100), node).gpus == (1,)
    result = place(GpuRequest(2, 100), node)
    assert [str(s) for s in result.why_not] == [
        "GPU 0: not healthy",
        "2 GPUs needed, 1 can take the share now",
    ]


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (GpuRequest(7), "asks for 7 GPUs and this node has 6"),
        (GpuRequest(1, 100, None, ("H100",)), "model H100; this node has A100-40GB, A30"),
        (GpuRequest(1, 100, 48 * GiB), "48GiB per GPU and the largest GPU it may use has 40GiB"),
        (GpuRequest(1, 100, 30 * GiB, ("A30",)), "the largest GPU it may use has 24GiB"),
    ],
)
def test_never_fits_says_why(request_: GpuRequest, words: str) -> None:
    with pytest.raises(Unschedulable, match="can never fit") as info:
        check_possible(request_, mixed_node())
    assert words in str(info.value)


def test_possible_requests_pass() -> None:
    check_possible(GpuRequest(6, 1000), mixed_node())
    check_possible(GpuRequest.exclusive(2, ("A100-40GB",)), mixed_node())


def test_binpack_fills_the_fullest_gpu_spread_the_emptiest() -> None:
    node = tuple(GpuView.idle(i, "A100", 40 * GiB) for i in range(3))
    node = take(node, GpuRequest(1, 300, 4 * GiB), [1])
    node = take(node, GpuRequest(1, 600, 4 * GiB), [2])
    small = GpuRequest(1, 200, 4 * GiB)
    assert place(small, node, "binpack").gpus == (2,)
    assert place(small, node, "spread").gpus == (0,)
    pair = GpuRequest(2, 400, 4 * GiB)
    assert place(pair, node, "binpack").gpus == (1, 2)
    assert place(pair, node, "spread").gpus == (0, 1)


def test_gpupool_keeps_a_whole_gpu_free_for_whole_gpu_work() -> None:
    # GPU 0 has 500 free, GPU 1 is idle; a 500 share on GPU 1 would leave no whole GPU
    node = tuple(GpuView.idle(i, "A100", 40 * GiB) for i in range(2))
    node = take(node, GpuRequest(1, 500, 1 * GiB), [0])
    target = target_of((GpuRequest(1, 1000), 0.5), (GpuRequest(1, 500, 1 * GiB), 0.5))
    assert place(GpuRequest(1, 500, 1 * GiB), node, "gpupool", target).gpus == (0,)
    assert fragment(node, target) == pytest.approx(250.0)


def test_gpupool_counts_memory_stranded_compute_as_fragment() -> None:
    # GPU 0: compute left but almost no memory; a share there strands nothing new
    node = (
        GpuView(0, "A100", 40 * GiB, 2 * GiB, 600),
        GpuView(1, "A100", 40 * GiB, 30 * GiB, 600),
    )
    target = target_of((GpuRequest(1, 300, 8 * GiB), 1.0))
    assert fragment(node, target) == pytest.approx(600.0)
    assert place(GpuRequest(1, 300, 1 * GiB), node, "gpupool", target).gpus == (0,)


def test_bad_policy_and_bad_requests_are_invalid() -> None:
    with pytest.raises(InvalidRequest, match="unknown policy 'best'; valid policies: random, "):
        place(GpuRequest(), mixed_node(), "best")
    with pytest.raises(InvalidRequest, match="compute"):
        GpuRequest(1, 0)
    with pytest.raises(InvalidRequest, match="GPU count"):
        GpuRequest(0)
    with pytest.raises(InvalidRequest, match="lacks room"):
        take(mixed_node(), GpuRequest(1, 100, 30 * GiB), [0])


gpu_views = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 40), st.sampled_from(["A", "B"])),
    min_size=1,
    max_size=6,
)
requests = st.builds(
    GpuRequest,
    gpus=st.integers(1, 3),
    compute=st.integers(1, 1000),
    memory=st.one_of(st.none(), st.integers(1, 40).map(lambda g: g * GiB)),
    gpu_models=st.sampled_from([(), ("A",), ("B",)]),
)


@settings(max_examples=200, deadline=None)
@given(gpu_views, requests, st.sampled_from(POLICY_NAMES))
def test_a_placement_always_fits_and_a_refusal_is_explained(
    views: list[tuple[int, int, str]], request: GpuRequest, policy: str
) -> None:
    node = tuple(
        GpuView(i, model, 40 * GiB, free_gib * GiB, compute)
        for i, (compute, free_gib, model) in enumerate(views)
    )
    result = place(request, node, policy)
    if result.gpus is None:
        assert result.why_not
        return
    assert len(result.gpus) == request.gpus
    after = take(node, request, result.gpus)  # raises if any GPU is over-committed
    assert all(gpu.compute_free >= 0 and gpu.memory_free >= 0 for gpu in after)
    assert never_fits(request, node) is None


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_decision_leaves_nothing_for_the_cyclic_collector(policy: str) -> None:
    """The daemon places each job on a state made for that decision: once it is decided, the
    state and its fragment index are freed at once, not left in a reference cycle whose
    collection would land inside some later decision."""
    node = (*mixed_node()[:3], GpuView(5, "A100-40GB", 40 * GiB, 30 * GiB, 600))
    requests = (GpuRequest(1, 300), GpuRequest(2, 200, 4 * GiB), GpuRequest(1, 1000))
    for request in requests:  # first use makes lasting things once (imports, caches): not counted
        place(request, node, policy)
    gc.collect()
    gc.disable()
    try:
        for request in requests:
            assert place(request, node, policy).fits
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_gpu_to_place_on_is_a_why_not_not_a_crash(policy: str) -> None:
    # every GPU set aside (all in MIG mode, or each another user's MPS server)
    placed = place(GpuRequest(gpus=1, compute=300, memory=GiB), (), policy)
    assert placed.gpus is None
    assert [str(lack) for lack in placed.why_not] == ["1 GPU needed, 0 can take the share now"]
