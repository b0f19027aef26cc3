"""Incremental allocate/release and the F_n cache agree with a from-scratch recomputation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.scheduler.helpers import naive_fragment, three_nodes

from gpupool.core.resources import NodeSpec, Request
from gpupool.scheduler import (
    ClusterState,
    Placement,
    TargetWorkload,
    demand_of,
    fragment_index,
    make_policy,
    place,
)
from gpupool.scheduler.fgd import fragment_options
from gpupool.scheduler.fragment import FragmentIndex
from gpupool.scheduler.gpupool_policy import GpupoolPolicy
from gpupool.scheduler.policy import Policy

NODES: list[NodeSpec] = [
    *three_nodes(),
    NodeSpec("n3", cpu=8000, host_memory=16 * 2**30, gpu_count=1, gpu_model="B"),
]

requests = st.one_of(
    st.builds(
        lambda milli, cpu, models: Request(gpus=1, compute=milli, cpu=cpu, gpu_models=models),
        st.sampled_from([100, 250, 300, 500, 700, 1000]),
        st.sampled_from([0, 1000, 4000, 12_000]),
        st.sampled_from([(), ("A",), ("B",)]),
    ),
    st.builds(
        lambda gpus, cpu: Request(gpus=gpus, compute=1000, cpu=cpu),
        st.integers(2, 4),
        st.sampled_from([1000, 8000]),
    ),
    st.builds(lambda cpu: Request(gpus=0, cpu=cpu), st.sampled_from([500, 6000, 20_000])),
)
# an operation: place a new request, or release the live pod at some position
operations = st.lists(st.tuples(st.booleans(), requests, st.integers(0, 50)), max_size=40)

TARGET = TargetWorkload.from_requests(
    [Request(gpus=1, compute=m, cpu=c) for m in (250, 500, 1000) for c in (1000, 4000)]
    + [Request(gpus=2, compute=1000, cpu=8000), Request(gpus=0, cpu=6000)]
    + [Request(gpus=1, compute=300, cpu=1000, gpu_models=("B",))] * 3
)


def fresh_state(live: list[tuple[Request, Placement]]) -> ClusterState:
    state = ClusterState(NODES)
    for request, placement in live:
        state.allocate(request, placement)
    return state


def replayed(
    ops: list[tuple[bool, Request, int]], state: ClusterState, policy: Policy
) -> Iterator[list[tuple[Request, Placement]]]:
    """Places or releases as each operation says, on `state` in place; after each, the pods
    live on it."""
    live: list[tuple[Request, Placement]] = []
    for adding, request, position in ops:
        if adding or not live:
            placement = place(state, request, policy)
            if placement is None:
                assert not state.feasible(request).any()
                continue
            assert state.feasible(request)[placement.node]
            state.allocate(request, placement)
            live.append((request, placement))
        else:
            request, placement = live.pop(position % len(live))
            state.release(request, placement)
        yield live


def assert_same(state: ClusterState, fresh: ClusterState) -> None:
    for name in (
        "gpu_free",
        "cpu_free",
        "mem_free",
        "gpu_free_total",
        "full_free",
        "max_free",
        "class_pods",
    ):
        assert getattr(state, name).tolist() == getattr(fresh, name).tolist(), name


@settings(max_examples=60, deadline=None)
@given(operations, st.sampled_from(["fgd", "gpupool", "random", "packing"]))
def test_incremental_state_and_fragments_match_recomputation(
    ops: list[tuple[bool, Request, int]], policy_name: str
) -> None:
    state = ClusterState(NODES)
    index = fragment_index(state, TARGET)
    policy = make_policy(policy_name, seed=3, target_workload=TARGET)
    for live in replayed(ops, state, policy):
        fresh = fresh_state(live)
        assert_same(state, fresh)
        rebuilt = FragmentIndex(state, TARGET)
        np.testing.assert_allclose(index.frag, rebuilt.frag)
        np.testing.assert_array_equal(index.cnt, rebuilt.cnt)
        np.testing.assert_array_equal(index.less, rebuilt.less)
        naive = [naive_fragment(state, n, TARGET) for n in range(state.n_nodes)]
        np.testing.assert_allclose(index.frag, naive)


@settings(max_examples=60, deadline=None)
@given(operations, requests)
def test_hypothetical_fragment_equals_fragment_after_allocating(
    ops: list[tuple[bool, Request, int]], request: Request
) -> None:
    state = ClusterState(NODES)
    policy = make_policy("random", seed=5)
    live: list[tuple[Request, Placement]] = []
    for _, earlier, _ in ops:
        placement = place(state, earlier, policy)
        if placement is not None:
            state.allocate(earlier, placement)
            live.append((earlier, placement))
    feasible = np.flatnonzero(state.feasible(request))
    if feasible.size == 0:
        return
    options = fragment_options(fragment_index(state, TARGET), request, feasible)
    for at, node in enumerate(feasible):
        gpu = int(options.gpus[at])
        if request.is_fractional:
            placement = Placement(int(node), (gpu,), request.compute)
        else:
            placement = state.best_gpu_placement(int(node), request)
        trial = fresh_state([*live, (request, placement)])
        assert options.after[at] == pytest.approx(naive_fragment(trial, int(node), TARGET))
        if request.is_fractional:
            # the chosen GPU is the one with the lowest F after, lowest index on ties
            afters = []
            for other in state.fitting_gpus(int(node), request):
                moved = Placement(int(node), (int(other),), request.compute)
                alt = fresh_state([*live, (request, moved)])
                afters.append((round(naive_fragment(alt, int(node), TARGET), 6), int(other)))
            assert min(afters)[1] == gpu


#: no spec bound to a model, multi-GPU specs, CPU and host memory asked: every part of
#: `gpupool`'s score (the stranding term, the idle-node clamp, both reserves) is in play
NET_TARGET = TargetWorkload.from_requests(
    [Request(gpus=1, compute=m, cpu=4000, host_memory=8 * 2**30) for m in (250, 500, 1000)]
    + [Request(gpus=4, compute=1000, cpu=8000, host_memory=16 * 2**30)] * 2
    + [Request(gpus=2, compute=1000, cpu=1000), Request(gpus=0, cpu=6000, host_memory=2**30)]
)
PROBES = [
    demand_of(r)
    for r in (
        Request(gpus=1, compute=500, cpu=1000, host_memory=4 * 2**30),
        Request(gpus=1, compute=1000, cpu=12_000),
        Request(gpus=2, compute=1000, cpu=8000, host_memory=2**30),
        Request(gpus=4, compute=1000, cpu=8000),
        Request(gpus=0, cpu=6000, host_memory=2**30),
    )
]


@settings(max_examples=60, deadline=None)
@given(operations)
def test_gpupool_kept_scores_equal_scores_worked_out_afresh(
    ops: list[tuple[bool, Request, int]],
) -> None:
    # the net score kept per demand and node must follow every change of the state
    state = ClusterState(NODES)
    policy = make_policy("gpupool", seed=3, target_workload=NET_TARGET)
    assert isinstance(policy, GpupoolPolicy)
    for live in replayed(ops, state, policy):
        fresh = fresh_state(live)
        assert policy.net(state).free_milli == state.total_gpu_milli - state.allocated_gpu_milli
        for probe in PROBES:
            feasible = np.flatnonzero(state.feasible(probe))
            if feasible.size:
                again = make_policy("gpupool", seed=3, target_workload=NET_TARGET)
                assert (
                    policy.scores(state, probe, feasible).tolist()
                    == again.scores(fresh, probe, feasible).tolist()
                )
