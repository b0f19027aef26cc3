"""The replay core: per-event arrays, drops, determinism, the fragment series."""

from __future__ import annotations

import numpy as np
import pytest
from tests.scheduler.helpers import cpu_only, share, three_nodes, whole

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.scheduler import (
    POLICY_NAMES,
    ClusterState,
    TargetWorkload,
    make_policy,
    place,
)
from gpupool.scheduler.fragment import FragmentIndex
from gpupool.sim.replay import replay
from gpupool.sim.synthetic import synthetic_nodes, synthetic_workload

PODS: list[Request] = [
    share(500),
    whole(2),
    cpu_only(cpu=4000),
    share(300, models=("B",)),
    whole(8),  # only n2 has eight GPUs
    whole(8),  # ... and only once
    share(700),
    whole(1, cpu=70_000),  # no node has 70 cores
] * 2
TARGET = TargetWorkload.from_requests(PODS)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_replay_records_every_event(policy: str) -> None:
    result = replay(three_nodes(), PODS, policy, 11, TARGET)
    requested = [pod.total_gpu_milli for pod in PODS]
    assert result.arrived_milli.tolist() == np.cumsum(requested).tolist()
    placed_milli = np.where(result.placed, requested, 0)
    assert result.allocated_milli.tolist() == np.cumsum(placed_milli).tolist()
    assert (result.idle_milli == 14_000 - result.allocated_milli).all()
    assert result.placed[0] and not (result.placed[4] and result.placed[5])
    assert not result.placed[7]
    assert result.failed_pods == int((~result.placed).sum())
    assert (result.fragment_milli >= 0).all()
    assert (result.fragment_milli <= result.idle_milli + 1e-9).all()
    assert (result.policy, result.seed) == (policy, 11)
    assert result.seconds > 0


@pytest.mark.parametrize("policy", ["fgd", "bestfit"])
def test_fragment_series_matches_a_fresh_computation_after_each_event(policy: str) -> None:
    result = replay(three_nodes(), PODS, policy, 3, TARGET)
    state = ClusterState(three_nodes())
    chooser = make_policy(policy, seed=3, target_workload=TARGET)
    for i, pod in enumerate(PODS):
        placement = place(state, pod, chooser)
        if placement is not None:
            state.allocate(pod, placement)
        assert result.fragment_milli[i] == pytest.approx(FragmentIndex(state, TARGET).total)
    again = replay(three_nodes(), PODS, policy, 3, TARGET)
    np.testing.assert_array_equal(result.fragment_milli, again.fragment_milli)
    np.testing.assert_array_equal(result.placed, again.placed)


def test_random_depends_on_the_seed() -> None:
    pods = [share(100)] * 30
    runs = {
        replay(three_nodes(), pods, "random", seed, TARGET).fragment_milli.tobytes()
        for seed in range(4)
    }
    assert len(runs) > 1


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="unknown policy 'nope'"):
        replay(three_nodes(), PODS, "nope", 1, TARGET)


@pytest.mark.parametrize("policy", ["bestfit", "gpupool"])
def test_a_replay_without_the_fragment_curve_places_the_same(policy: str) -> None:
    nodes = synthetic_nodes(1)
    pods = synthetic_workload(1, load_pct=120, seed=4)
    target = TargetWorkload.from_requests(pods)
    kept = replay(nodes, pods, policy, 4, target)
    bare = replay(nodes, pods, policy, 4, target, fragment_curve=False)
    assert np.array_equal(kept.allocated_milli, bare.allocated_milli)
    assert np.isnan(bare.fragment_milli).all() and not np.isnan(kept.fragment_milli).any()
