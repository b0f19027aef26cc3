"""Compute shares: a duty cycle measured from the workload's own GPU time, on the simulated driver.

Each run launches work for a fixed wall time and reports how many launches completed; throughput
is launches per second, compared with the same loop run without a compute share (exclusive). On
the simulated driver a kernel of 256 x 128 threads occupies its GPU for 1 ms, so a one-second
run at 25 % is about 250 kernels: quantisation is far below the 5-point tolerance.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from shim_support import (
    PROGS,
    Result,
    arbiter,
    compile_prog,
    gpu_uuid,
    make_node,
    register,
    run_client,
    shim_env,
)

pytestmark = pytest.mark.serial  # wall-clock shares and latencies: run alone (Makefile)

SECONDS = 1.0
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_node(tmp_path_factory.mktemp("node"))


def throughput(result: Result) -> float:
    """Launches per second of one `run` step."""
    assert result.returncode == 0, result.stderr
    ((launches, elapsed_ns),) = result.step("run")
    return int(launches) * 1e9 / int(elapsed_ns)


_exclusive: dict[str, float] = {}


def exclusive(client: Path, node: Path, kind: str) -> float:
    """The kind's throughput with no compute share (once per kind)."""
    if kind not in _exclusive:
        _exclusive[kind] = throughput(run_client(client, shim_env(node), "run", SECONDS, kind))
    return _exclusive[kind]


@pytest.mark.parametrize(
    ("percent", "kind"),
    [
        (25, "kernel"),
        (50, "kernel"),
        (75, "kernel"),
        (50, "graph"),  # a CUDA graph of 4 kernels per launch
        (25, "procgraph"),  # cuGraphLaunch_ptsz fetched through cuGetProcAddress
        (40, "coop"),
        (60, "ex"),
        (25, "nocurrent"),  # no context current on the launching thread: the stream's context
    ],
)
def test_a_compute_share_holds_within_five_points(
    client: Path, node: Path, percent: int, kind: str
) -> None:
    env = shim_env(node, COMPUTE_LIMIT=str(percent))
    share = throughput(run_client(client, env, "run", SECONDS, kind))
    ratio = share / exclusive(client, node, kind)
    assert abs(ratio - percent / 100) <= TOLERANCE, f"{kind} at {percent} %: {ratio:.3f}"


def test_no_share_means_no_throttling(client: Path, node: Path) -> None:
    env = shim_env(node, COMPUTE_LIMIT="100")
    ratio = throughput(run_client(client, env, "run", SECONDS, "kernel")) / exclusive(
        client, node, "kernel"
    )
    assert ratio > 0.97


def test_share_policy_uses_an_idle_gpu(client: Path, tmp_path: Path) -> None:
    """Work-conserving needs the arbiter (it alone knows the GPU is idle): registered with it,
    as every launch registers a share; without it the share holds its cap alone."""
    idle = make_node(tmp_path / "idle")
    with arbiter(tmp_path / "arbiter") as (control, _pid):
        settings = register(control, gpu_uuid(idle), 30, "share")
        env = shim_env(idle, COMPUTE_LIMIT="30", COMPUTE_POLICY="share", **settings)
        ratio = throughput(run_client(client, env, "run", SECONDS, "kernel")) / exclusive(
            client, idle, "kernel"
        )
    # issue 8's target: 90 % or more (about 98 % on a quiet machine; 94.6 % seen under load)
    assert ratio >= 0.90


def test_cap_policy_stays_at_its_share_on_an_idle_gpu(client: Path, tmp_path: Path) -> None:
    idle = make_node(tmp_path / "idle")
    env = shim_env(idle, COMPUTE_LIMIT="30", COMPUTE_POLICY="cap")
    ratio = throughput(run_client(client, env, "run", SECONDS, "kernel")) / exclusive(
        client, idle, "kernel"
    )
    assert abs(ratio - 0.30) <= TOLERANCE


def test_processes_of_one_share_hold_its_percentage_together(client: Path, tmp_path: Path) -> None:
    shared = make_node(tmp_path / "shared")
    base = exclusive(client, shared, "kernel")
    env = shim_env(shared, COMPUTE_LIMIT="40", SHARED_REGION=str(tmp_path / "region"))
    results: list[Result] = []
    lock = threading.Lock()

    def one() -> None:
        result = run_client(client, env, "run", SECONDS, "kernel")
        with lock:
            results.append(result)

    workers = [threading.Thread(target=one) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    together = sum(throughput(result) for result in results) / base
    assert abs(together - 0.40) <= TOLERANCE, f"two processes of a 40 % share: {together:.3f}"


def test_the_library_counts_launches_per_entry_point(client: Path, node: Path) -> None:
    env = shim_env(node, COMPUTE_LIMIT="50", LOG_LEVEL="info")
    result = run_client(client, env, "run", 0.2, "kernel", "run", 0.2, "procgraph")
    ((kernels, _), (graphs, _)) = result.step("run")
    assert result.gpupool_lines()[-1] == (
        f"{result.prefix}launches seen: cuLaunchKernel {kernels} ({kernels} held), "
        f"cuGraphLaunch_ptsz {graphs} ({graphs} held)"
    )


def test_launches_with_no_share_are_counted_as_not_held(client: Path, node: Path) -> None:
    result = run_client(client, shim_env(node, LOG_LEVEL="info"), "run", 0.1, "nocurrent")
    ((launches, _),) = result.step("run")
    assert result.gpupool_lines()[-1] == (
        f"{result.prefix}launches seen: cuLaunchKernel {launches} (0 held)"
    )


def test_export_table_lookups_are_named_at_info_level(client: Path, node: Path) -> None:
    quiet = run_client(client, shim_env(node), "exporttable")
    assert quiet.step("exporttable") == [["1"]]  # the simulated driver has no private tables
    assert quiet.gpupool_lines() == []
    result = run_client(client, shim_env(node, LOG_LEVEL="info"), "exporttable")
    assert f"{result.prefix}cuGetExportTable(0102030405060708090a0b0c0d0e0f10): 1" in (
        result.gpupool_lines()
    )
