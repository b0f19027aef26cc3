"""Feasibility, GPU choice, allocate and release on hand-built clusters."""

from __future__ import annotations

import numpy as np
import pytest
from tests.scheduler.helpers import cpu_only, share, three_nodes, whole

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import GiB
from gpupool.scheduler import ClusterState, Placement


def feasible_nodes(state: ClusterState, request: object) -> list[int]:
    return [int(i) for i in np.flatnonzero(state.feasible(request))]  # type: ignore[arg-type]


def test_padded_gpu_array_marks_absent_gpus() -> None:
    state = ClusterState(three_nodes())
    assert state.gpu_free.shape == (3, 8)
    assert state.gpu_free[0].tolist() == [1000, 1000] + [-1] * 6
    assert state.gpu_free_total.tolist() == [2000, 4000, 8000]


def test_cpu_and_memory_limit_feasibility() -> None:
    state = ClusterState(three_nodes())
    assert feasible_nodes(state, share(500, cpu=20_000)) == [0, 1]
    assert feasible_nodes(state, share(500, cpu=40_000)) == [1]
    assert feasible_nodes(state, share(500, memory=100 * GiB)) == [1]
    assert feasible_nodes(state, cpu_only(cpu=70_000)) == []


def test_gpu_model_must_be_allowed_and_empty_means_any() -> None:
    state = ClusterState(three_nodes())
    assert feasible_nodes(state, share(500, models=("B",))) == [1]
    assert feasible_nodes(state, share(500, models=("A", "C"))) == [0, 2]
    assert feasible_nodes(state, share(500)) == [0, 1, 2]
    # a CPU-only request uses no GPU, so its model list does not restrict it
    assert feasible_nodes(state, cpu_only()) == [0, 1, 2]


def test_share_needs_one_gpu_with_enough_free_milli() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(700), Placement(0, (0,), 700))
    state.allocate(share(700), Placement(0, (1,), 700))
    assert feasible_nodes(state, share(300)) == [0, 1, 2]
    assert feasible_nodes(state, share(301)) == [1, 2]


def test_whole_gpus_must_be_completely_free_on_one_node() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(100), Placement(1, (2,), 100))
    assert feasible_nodes(state, whole(4)) == [2]
    assert feasible_nodes(state, whole(3)) == [1, 2]
    assert feasible_nodes(state, whole(9)) == []


def test_best_gpu_is_least_free_that_fits_lowest_index_on_ties() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(600), Placement(2, (1,), 600))  # free 400
    state.allocate(share(300), Placement(2, (3,), 300))  # free 700
    state.allocate(share(300), Placement(2, (5,), 300))  # free 700
    assert state.best_gpu_placement(2, share(400)).gpus == (1,)
    assert state.best_gpu_placement(2, share(500)).gpus == (3,)
    assert state.best_gpu_placement(2, share(800)).gpus == (0,)


def test_whole_gpu_request_takes_first_free_gpus_by_index() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(100), Placement(2, (1,), 100))
    placement = state.best_gpu_placement(2, whole(3))
    assert placement == Placement(2, (0, 2, 3), 1000)
    assert state.best_gpu_placement(2, cpu_only()) == Placement(2, (), 0)


def test_allocate_then_release_restores_everything() -> None:
    state = ClusterState(three_nodes())
    request = whole(2, cpu=5000, memory=3 * GiB)
    placement = Placement(1, (0, 3), 1000)
    state.allocate(request, placement)
    assert state.gpu_free[1, :4].tolist() == [0, 1000, 1000, 0]
    assert (state.cpu_free[1], state.mem_free[1]) == (59_000, 125 * GiB)
    assert (state.full_free[1], state.gpu_free_total[1]) == (2, 2000)
    assert state.class_pods[1, 2] == 1
    assert state.allocated_gpu_milli == 2000
    state.release(request, placement)
    fresh = ClusterState(three_nodes())
    for name in ("gpu_free", "cpu_free", "mem_free", "gpu_free_total", "full_free", "max_free"):
        assert getattr(state, name).tolist() == getattr(fresh, name).tolist(), name
    assert not state.class_pods.any()


@pytest.mark.parametrize(
    ("request_", "placement", "message"),
    [
        (share(500), Placement(3, (0,), 500), "node 3 out of range"),
        (share(500), Placement(0, (2,), 500), "node 0 has no GPU 2"),
        (share(500), Placement(0, (0,), 400), "milli 400"),
        (whole(2), Placement(0, (0, 0), 1000), "for a request of 2 GPUs"),
        (share(500, cpu=40_000), Placement(0, (0,), 500), "lacks CPU"),
    ],
)
def test_bad_allocation_is_refused_and_changes_nothing(
    request_: object, placement: Placement, message: str
) -> None:
    state = ClusterState(three_nodes())
    before = state.gpu_free.copy(), state.cpu_free.copy()
    with pytest.raises(InvalidRequest, match=message):
        state.allocate(request_, placement)  # type: ignore[arg-type]
    assert state.gpu_free.tolist() == before[0].tolist()
    assert state.cpu_free.tolist() == before[1].tolist()


def test_overfull_gpu_and_unheld_release_are_refused() -> None:
    state = ClusterState(three_nodes())
    state.allocate(share(700), Placement(0, (0,), 700))
    with pytest.raises(InvalidRequest, match="lacks milli"):
        state.allocate(share(400), Placement(0, (0,), 400))
    with pytest.raises(InvalidRequest, match="not that used"):
        state.release(share(400), Placement(0, (1,), 400))


def test_empty_cluster_is_invalid() -> None:
    with pytest.raises(InvalidRequest, match="no nodes"):
        ClusterState([])
