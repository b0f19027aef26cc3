"""/metrics's own text format against prometheus_client's, byte for byte, on a busy agent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from tests.api.metrics_support import busy_agent

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.api.exposition import render
from gpupool.api.metrics import AgentCollector
from gpupool.devices.factory import open_backend


def test_render_writes_what_prometheus_client_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        agent.observed.sampled(backend.snapshot(), {})
        busy_agent(agent)
        now = time.time()
        monkeypatch.setattr(time, "time", lambda: now)  # the oldest wait, the same for both
        collector = AgentCollector(agent.view)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        ours = render(collector.families())
        theirs = generate_latest(registry)
        agent.store.close()
    assert ours.decode().splitlines() == theirs.decode().splitlines()
    assert ours == theirs
    text = ours.decode()
    # what the comparison covers: escaped labels, counters, histograms, exponents, no value
    assert r'job_name="say \"hi\" \\ to the ünïcode job"' in text
    assert r'user="o\"brien\\\nx"' in text
    assert 'gpupool_job_throttled_seconds_total{UUID="GPU-' in text
    assert "vGPU_device_memory_limit_in_bytes{" in text and "e+09\n" in text
    assert 'gpupool_scheduling_latency_seconds_bucket{le="+Inf"} 4.0' in text
    assert 'gpupool_queue_length{priority="low"} 1.0' in text
    assert text.count("gpupool_job_compute_utilization_percent{") == 3  # alice's has no value
