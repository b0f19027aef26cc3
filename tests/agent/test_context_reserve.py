"""The context reserve: admission sets memory aside per job and GPU for what a share does not
count (a CUDA context), so that admitted shares also fit physically."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import CUDA_JOB, Daemon, cli, scrape, until

from gpupool.core.errors import Unschedulable
from gpupool.core.units import GiB


@pytest.fixture
def reserved(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "1xA100-40GB", "--context-reserve", "1Gi")


def test_each_job_takes_its_share_and_the_reserve(reserved: Daemon) -> None:
    gpu = reserved.call("GET", "/v1/node")
    assert gpu["context_reserve"] == GiB
    total = gpu["gpus"][0]["memory_total"]
    assert total == 40 * GiB  # the GPU's own size, not net of the reserve
    # 19 + 1 + 19 + 1: exactly the GPU; a third job of any size must wait
    first = reserved.submit(["sleep", "30"], memory="19Gi", compute=10)
    second = reserved.submit(["sleep", "30"], memory="19Gi", compute=10)
    third = reserved.submit(["sleep", "30"], memory="1Mi", compute=10)
    reserved.wait(first, ("running",))
    reserved.wait(second, ("running",))
    # why a job waits is the last queue pass's word: the third may have come after the pass
    # that started the second, and then its reasons are there from the next pass
    described = until(
        lambda: (found := reserved.call("GET", f"/v1/jobs/{third}"))["waiting"] and found
    )
    assert reserved.job(third)["state"] == "queued"
    waiting = "\n".join(described["waiting"])
    assert "memory 1MiB needed, 0B free" in waiting
    assert "1GiB per job and GPU for CUDA contexts" in waiting
    assert reserved.call("GET", "/v1/node")["gpus"][0]["memory_admitted"] == total
    reserved.call("POST", f"/v1/jobs/{first}/cancel", json={})
    assert reserved.wait(third, ("running",))["state"] == "running"


def test_an_exclusive_job_holds_the_whole_gpu_and_no_share_lands_beside_it(
    reserved: Daemon,
) -> None:
    whole = reserved.submit([sys.executable, CUDA_JOB, "30"], mode="exclusive")
    assert reserved.wait(whole, ("running",))["memory"] == 40 * GiB  # not net of the reserve
    gpu = reserved.call("GET", "/v1/node")["gpus"][0]
    assert (gpu["memory_admitted"], gpu["compute_admitted"]) == (40 * GiB, 1000)
    shown = cli("ps", url=reserved.url, check=True).stdout.splitlines()
    assert "40GiB" in next(line for line in shown if line.startswith(str(whole))).split()
    described = cli("describe", str(whole), url=reserved.url, check=True).stdout
    assert "1 GPU(s), 40GiB and 100% compute each, mode exclusive" in described
    limits = scrape(reserved)["vGPU_device_memory_limit_in_bytes"]
    assert [value for labels, value in limits if labels["job_id"] == str(whole)] == [40 * GiB]
    gpus = ("gpus", "--node-dir", str(reserved.node_dir))
    mark = f"job {whole}, 40GiB share"  # once the watchdog has seen its process
    assert until(lambda: mark in cli(*gpus, url=reserved.url, check=True).stdout)
    # the whole GPU is taken: even the smallest share waits for it
    shared = reserved.submit(["true"], memory="1Mi", compute=10)
    waiting = until(lambda: reserved.call("GET", f"/v1/jobs/{shared}")["waiting"])
    assert "memory 1MiB needed, 0B free" in "\n".join(waiting)
    assert reserved.job(shared)["state"] == "queued"
    reserved.call("POST", f"/v1/jobs/{whole}/cancel", json={})
    assert reserved.wait(shared)["state"] == "succeeded"


def test_a_share_that_leaves_no_room_for_its_context_never_fits(reserved: Daemon) -> None:
    refused = cli("submit", "--memory", "40Gi", "--", "true", url=reserved.url)
    assert refused.returncode == Unschedulable.exit_code
    assert refused.stderr.count("\n") == 1
    assert "39GiB" in refused.stderr and "1GiB per GPU for its CUDA context" in refused.stderr
    assert reserved.call("GET", "/v1/jobs", params={"all": True})["jobs"] == []
    fits = reserved.submit(["true"], memory="39Gi")
    assert reserved.wait(fits)["state"] == "succeeded"


def test_the_reserve_holds_after_a_restart(reserved: Daemon) -> None:
    running = reserved.submit(["sleep", "30"], memory="30Gi", compute=10)
    reserved.wait(running, ("running",))
    reserved.kill()
    reserved.start()
    waits = reserved.submit(["true"], memory="9Gi", compute=10)  # 30 + 1 + 9 + 1 > 40
    fits = reserved.submit(["true"], memory="8Gi", compute=10)  # backfilled: 30 + 1 + 8 + 1
    assert reserved.wait(fits)["state"] == "succeeded"
    assert reserved.job(waits)["state"] == "queued"


def test_a_simulated_node_reserves_nothing_by_default(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, "1xA30").start()
    try:
        assert daemon.call("GET", "/v1/node")["context_reserve"] == 0
    finally:
        daemon.stop()


@pytest.mark.parametrize("bad", ["3x", "-1Gi", "lots"])
def test_a_bad_reserve_is_one_line_and_starts_nothing(tmp_path: Path, bad: str) -> None:
    state = tmp_path / "state"
    result = cli(
        "serve",
        "--simulate",
        "1xA30",
        "--state-dir",
        str(state),
        "--context-reserve",
        bad,
        url="unix:///nonexistent",
    )
    assert result.returncode == 2
    assert result.stderr.startswith("gpupool: error: --context-reserve:")
    assert result.stderr.count("\n") == 1
    assert not state.exists()


def test_describe_shows_live_memory_and_the_part_over_the_share(reserved: Daemon) -> None:
    job_id = reserved.submit([sys.executable, CUDA_JOB, "30", "256"], memory="1Gi", compute=10)
    reserved.wait(job_id, ("running",))
    deadline = time.monotonic() + 20
    while not reserved.job(job_id).get("live_memory") and time.monotonic() < deadline:
        time.sleep(0.2)
    described = cli("describe", str(job_id), url=reserved.url, check=True).stdout
    # the simulated driver charges a context nothing: the job's 256 MiB are inside its share
    assert "using:    256MiB now (0B over the share)" in described
