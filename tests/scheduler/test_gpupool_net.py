"""`gpupool`'s net score of one node in plain Python equals numpy's over many, bit for bit."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import GiB
from gpupool.scheduler import ClusterState, Demand, TargetWorkload, demand_of, make_policy
from gpupool.scheduler.gpupool_policy import DECIMALS, GpupoolPolicy, rounded

TARGET = TargetWorkload.from_requests(
    [Request(gpus=1, compute=m, cpu=4000, host_memory=8 * GiB) for m in (250, 500, 1000)]
    + [Request(gpus=8, compute=1000, cpu=64_000, host_memory=64 * GiB)]
    + [Request(gpus=0, cpu=6000, host_memory=GiB)]
)
NODES = [
    NodeSpec(f"n{i}", cpu=96_000, host_memory=512 * GiB, gpu_count=gpus, gpu_model="A")
    for i, gpus in enumerate([8, 8, 4, 2, 8, 1])
]

nodes_now = st.lists(
    st.tuples(
        st.integers(0, 8),  # whole free GPUs
        st.integers(0, 8000),  # free GPU milli
        st.integers(0, 96_000),  # free CPU
        st.integers(0, 512 * GiB),  # free host memory
        st.floats(-5000, 5000, allow_nan=False) | st.sampled_from([0.0, -0.0, 250.0, -62.5]),
    ),
    min_size=len(NODES),
    max_size=len(NODES),
)
demands = st.builds(
    lambda gpus, milli, cpu, memory: demand_of(
        Request(gpus=gpus, compute=milli if gpus == 1 else 1000, cpu=cpu, host_memory=memory)
    ),
    st.sampled_from([0, 1, 2, 8]),
    st.sampled_from([100, 250, 500, 1000]),
    st.integers(0, 96_000),
    st.integers(0, 64 * GiB),
)


def bits(value: float) -> str:
    return float(value).hex() + ("-" if math.copysign(1.0, value) < 0 else "+")


@settings(max_examples=300, deadline=None)
@given(nodes_now, demands)
def test_one_node_in_python_is_numpy_over_many(
    rows: list[tuple[int, int, int, int, float]], demand: Demand
) -> None:
    state = ClusterState(NODES)
    for node, (whole, milli, cpu, memory, _) in enumerate(rows):
        # only the values the score reads, set directly: the two paths must agree on any
        state.full_free[node] = min(whole, int(state.gpu_count[node]))
        state.gpu_free_total[node] = milli
        state.cpu_free[node] = cpu
        state.mem_free[node] = memory
    delta = np.array([row[4] for row in rows], np.float64)
    policy = make_policy("gpupool", seed=0, target_workload=TARGET)
    assert isinstance(policy, GpupoolPolicy) and policy.keep_idle_gpus == 8
    everyone = np.arange(len(NODES))
    many = policy.net_scores(state, demand, everyone, delta)
    one = [policy.net_score_of(state, demand, n, float(delta[n])) for n in everyone.tolist()]
    assert [bits(x) for x in one] == [bits(x) for x in many.tolist()]


@settings(max_examples=500, deadline=None)
@given(
    st.floats(-1e7, 1e7, allow_nan=False)
    | st.integers(-(10**9), 10**9).map(lambda k: (k + 0.5) / 10**DECIMALS)
    | st.sampled_from([0.0, -0.0, 5e-7, -5e-7, 2.5e-6, -2.5e-6, 1e-9, -1e-9])
)
def test_rounded_is_numpys_round(score: float) -> None:
    assert bits(rounded(score)) == bits(float(np.round(np.float64(score), DECIMALS)))
