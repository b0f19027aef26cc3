"""/metrics on a real daemon with busy jobs on a simulated node; the collector on a closed store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, Samples, scrape, until

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.api.metrics import AgentCollector
from gpupool.core.units import GiB
from gpupool.devices.factory import open_backend


def job_values(samples: Samples, name: str) -> dict[str, float]:
    return {labels["job_id"]: value for labels, value in samples.get(name, [])}


def test_busy_jobs_show_their_use_and_share_and_vanish_when_they_end(daemon: Daemon) -> None:
    ids = [
        daemon.submit([sys.executable, CUDA_JOB, "60", str(hold)], memory="2Gi", compute=30)
        for hold in (256, 768)
    ]
    queued = daemon.submit([sys.executable, CUDA_JOB, "1"], gpus=2, compute=100)

    def busy() -> Samples | None:
        samples = scrape(daemon)
        used = job_values(samples, "vGPU_device_memory_usage_in_bytes")
        util = job_values(samples, "gpupool_job_compute_utilization_percent")
        ready = all(used.get(str(i), 0) > 0 and util.get(str(i), 0) > 0 for i in ids)
        return samples if ready else None

    samples = until(busy)
    assert samples, scrape(daemon)
    used = job_values(samples, "vGPU_device_memory_usage_in_bytes")
    assert used == {str(ids[0]): 256 << 20, str(ids[1]): 768 << 20}
    limits = job_values(samples, "vGPU_device_memory_limit_in_bytes")
    assert limits == {str(i): 2 * GiB for i in ids}
    shares = job_values(samples, "gpupool_job_compute_share_percent")
    assert shares == {str(i): 30 for i in ids}
    states = {labels["job_id"]: labels["state"] for labels, _ in samples["gpupool_job_state"]}
    assert states == {str(ids[0]): "running", str(ids[1]): "running", str(queued): "queued"}
    assert {lab["priority"]: v for lab, v in samples["gpupool_queue_length"]}["high"] == 1
    (gpu0,) = [v for lab, v in samples["DCGM_FI_DEV_FB_USED"] if lab["gpu"] == "0"]
    assert gpu0 == 1024  # MiB, as dcgm-exporter
    assert {lab["UUID"] for lab, _ in samples["DCGM_FI_DEV_GPU_UTIL"]} == {
        lab["UUID"] for lab, _ in samples["gpupool_gpu_healthy"]
    }
    assert samples["gpupool_up"] == [({}, 1.0)]
    (count,) = [v for _, v in samples["gpupool_scheduling_latency_seconds_count"]]
    assert count >= 1

    daemon.call("POST", f"/v1/jobs/{ids[0]}/cancel", json={})
    daemon.wait(ids[0])

    def gone() -> bool:
        samples = scrape(daemon)
        return str(ids[0]) not in job_values(samples, "vGPU_device_memory_limit_in_bytes") and (
            str(ids[0]) not in job_values(samples, "gpupool_job_state")
        )

    assert until(gone)


def by_reason(samples: Samples, job_id: int) -> dict[str, float]:
    return {
        labels["reason"]: value
        for labels, value in samples.get("gpupool_job_throttled_seconds_total", [])
        if labels["job_id"] == str(job_id)
    }


def test_throttled_time_and_refused_allocations_are_counted_per_job(daemon: Daemon) -> None:
    capped, other = (
        daemon.submit([sys.executable, CUDA_JOB, "60"], memory="2Gi", compute=30) for _ in range(2)
    )
    # past its 1 GiB share: refused (the process exits 2), and the job lives on in its shell
    greedy = daemon.submit(
        ["sh", "-c", f"{sys.executable} {CUDA_JOB} 0 256 2048; exec sleep 60"],
        memory="1Gi",
        compute=10,
    )
    # a whole GPU with no limits: no region, so no counters (and no failed scrape)
    whole = daemon.submit([sys.executable, CUDA_JOB, "60"], gpus=1, mode="exclusive")

    def counted() -> Samples | None:
        samples = scrape(daemon)
        throttled = by_reason(samples, capped)
        refused = job_values(samples, "gpupool_job_refused_allocations_total")
        ready = throttled.get("cap", 0) > 0.5 and refused.get(str(greedy), 0) >= 1
        return samples if ready else None

    first = until(counted, timeout=30)
    assert first, scrape(daemon)
    labels = {
        labels["job_id"]: labels for labels, _ in first["gpupool_job_refused_allocations_total"]
    }
    assert set(labels) == {str(capped), str(other), str(greedy)}
    states = {labels["job_id"]: labels["state"] for labels, _ in first["gpupool_job_state"]}
    assert states[str(whole)] == "running"
    assert str(whole) in job_values(first, "vGPU_device_memory_limit_in_bytes")
    assert labels[str(greedy)]["gpu"] == "0" and labels[str(greedy)]["UUID"].startswith("GPU-")
    refused = job_values(first, "gpupool_job_refused_allocations_total")
    assert refused == {str(capped): 0, str(other): 0, str(greedy): 1}
    assert by_reason(first, other)["cap"] > 0  # the other 30 % job is held back too
    time.sleep(1.5)
    later = scrape(daemon)
    # a 30 % cap next to a busy job: most of every second is held back, and the counter grows
    grew = by_reason(later, capped)["cap"] - by_reason(first, capped)["cap"]
    assert grew > 0.5, (by_reason(first, capped), by_reason(later, capped))
    assert job_values(later, "gpupool_job_refused_allocations_total")[str(greedy)] == 1

    # a region the daemon cannot read: that job's counters are left out, the scrape still works
    (region,) = (daemon.state_dir / "jobs" / str(greedy)).glob("gpupool-share-*/region")
    region.write_bytes(b"\xff" * 4096)
    spoiled = scrape(daemon)
    assert spoiled["gpupool_up"] == [({}, 1.0)]
    assert set(job_values(spoiled, "gpupool_job_refused_allocations_total")) == {
        str(capped),
        str(other),
    }
    assert str(greedy) in job_values(spoiled, "vGPU_device_memory_limit_in_bytes")


def test_a_scrape_of_a_closed_store_says_down_and_raises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").mkdir()
    with open_backend("1xA30", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        collector = AgentCollector(agent.view)
        names = {family.name for family in collector.collect()}
        assert {"DCGM_FI_DEV_FB_USED", "gpupool_jobs", "gpupool_up"} <= names
        agent.store.close()  # what a stopping daemon's last scrape may meet
        for _ in range(3):
            (up,) = list(collector.collect())
            assert up.name == "gpupool_up" and up.samples[0].value == 0
    assert caplog.text.count("/metrics: DaemonError") == 1  # logged once, not once per scrape
