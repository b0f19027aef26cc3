"""/metrics's own text format against prometheus_client's, byte for byte, on a busy agent."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import JobSpec
from gpupool.agent.usage import Usage
from gpupool.api.exposition import render
from gpupool.api.metrics import AgentCollector
from gpupool.core.resources import Mode, Priority
from gpupool.devices.factory import open_backend
from gpupool.isolation import region
from gpupool.isolation.launch import new_shared_region

#: a name and a user with every character the text format escapes, and some it does not
ODD_NAME = 'say "hi" \\ to\nthe ünïcode job'
ODD_USER = 'o"brien\\'


def write_region(path: Path, counters: list[tuple[int, int, int]]) -> None:
    data = bytearray(region.FILE_SIZE)
    region.HEADER.pack_into(data, 0, region.MAGIC, region.VERSION, region.FILE_SIZE, 7)
    for device, values in enumerate(counters):
        region.COUNTERS.pack_into(
            data, region.COUNTERS_OFFSET + device * region.COUNTERS.size, *values
        )
    path.write_bytes(bytes(data))


def busy_agent(agent: Agent) -> None:
    """Running jobs with usage and counters, queued ones of both priorities, a flagged job,
    and both histograms observed."""
    store = agent.store
    for n, (name, user, gpus) in enumerate(
        [(ODD_NAME, ODD_USER, [0, 1]), ("", "alice", [1]), ("train", "bob", [0])]
    ):
        spec = JobSpec(argv=(sys.executable, "-c", "pass"), gpus=len(gpus), compute=333, name=name)
        job = store.start(store.add(spec, 1000 + n, user), gpus, [3 << 30] * len(gpus), "placed")
        agent.jobdir(job.id).path.mkdir(parents=True, exist_ok=True)
        write_region(
            new_shared_region(agent.jobdir(job.id).path),
            [(n, 1_500_000_000 * (n + 1), 7), (2, 3, 40_000_000_000)],
        )
        for gpu in gpus:
            agent.observed.per_gpu[(job.id, gpu)] = Usage(123 << 20, None if n == 1 else 42)
    agent.watchdog.flagged.add(job.id)
    whole = JobSpec(argv=("sleep", "60"), mode=Mode.EXCLUSIVE)
    store.start(store.add(whole, 0, "root"), [1], [], "placed")
    store.add(JobSpec(argv=("sleep", "1"), priority=Priority.LOW), 0, "root")
    store.add(JobSpec(argv=("sleep", "1"), name="next"), 0, "root")
    for seconds in (0.0002, 0.003, 0.2, 7.0):
        agent.observed.scheduling.observe(seconds)
        agent.observed.started(0.0, now=seconds * 1000)


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
        collector = AgentCollector(agent)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        ours = render(collector.families())
        theirs = generate_latest(registry)
        agent.store.close()
    assert ours.decode().splitlines() == theirs.decode().splitlines()
    assert ours == theirs
    text = ours.decode()
    # what the comparison covers: escaped labels, counters, histograms, exponents, no value
    assert r'job_name="say \"hi\" \\ to\nthe ünïcode job"' in text
    assert r'user="o\"brien\\"' in text
    assert 'gpupool_job_throttled_seconds_total{UUID="GPU-' in text
    assert "vGPU_device_memory_limit_in_bytes{" in text and "e+09\n" in text
    assert 'gpupool_scheduling_latency_seconds_bucket{le="+Inf"} 4.0' in text
    assert 'gpupool_queue_length{priority="low"} 1.0' in text
    assert text.count("gpupool_job_compute_utilization_percent{") == 3  # alice's has no value
