"""/metrics: Prometheus metrics built from the agent's state at each scrape.

A custom collector reads the agent (the last GPU snapshot, the store's queued and running jobs,
the scheduling histograms) when Prometheus asks, so a job that ended is simply absent from the
next scrape: nothing is registered per job, nothing leaks. Names follow dcgm-exporter for GPUs
and HAMi for a share's memory; the rest are gpupool_*. docs/metrics.md lists them all.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpupool.agent.agent import Agent
from gpupool.agent.jobs import Job, State
from gpupool.agent.observe import HistogramReading
from gpupool.agent.usage import Usage
from gpupool.core.errors import ConfigError
from gpupool.core.resources import Mode
from gpupool.core.units import MILLI_PER_GPU
from gpupool.devices.snapshot import GpuSnapshot
from gpupool.isolation.launch import find_shared_region
from gpupool.isolation.region import DeviceCounters, read_counters

MIB = 1 << 20
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
JOB_GPU_LABELS = ("job_id", "job_name", "user", "gpu", "UUID")


def _gpu_labels(gpu: GpuSnapshot, host: str) -> list[str]:
    return [str(gpu.index), gpu.uuid, f"nvidia{gpu.index}", gpu.model, host]


def _histogram(name: str, doc: str, reading: HistogramReading) -> HistogramMetricFamily:
    buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in reading.buckets]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=reading.total)


class AgentCollector(Collector):
    """Every metric, read from `agent` at scrape time."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.host = socket.gethostname()
        self._reported: set[str] = set()
        #: each running job's accounting region, once found
        self._regions: dict[int, Path] = {}

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpupool_up", "1 when the daemon could read all its state")
        try:
            families = [*self._gpus(), *self._jobs()]
        except Exception as err:  # a store closing under a stopping daemon: say so, not crash
            self._report(err)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _report(self, err: Exception) -> None:
        kind = type(err).__name__
        if kind not in self._reported:  # once per kind of failure, not once per scrape
            self._reported.add(kind)
            print(f"gpupool serve: /metrics: {kind}: {err}", file=sys.stderr, flush=True)

    def _gpus(self) -> list[Metric]:
        snapshot = self.agent.observed.snapshot
        gpus = snapshot.gpus if snapshot is not None else ()
        dcgm = {
            "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB)",
            "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB)",
            "DCGM_FI_DEV_FB_TOTAL": "Framebuffer memory total (in MiB)",
            "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %)",
            "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W)",
            "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C)",
            "gpupool_gpu_healthy": "1 when the GPU answers and is healthy, else 0",
        }
        families = {
            name: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc in dcgm.items()
        }
        for gpu in gpus:
            labels = _gpu_labels(gpu, self.host)
            readings: dict[str, float | None] = {
                "DCGM_FI_DEV_FB_USED": gpu.memory_used / MIB,
                "DCGM_FI_DEV_FB_FREE": gpu.memory_free / MIB,
                "DCGM_FI_DEV_FB_TOTAL": gpu.memory_total / MIB,
                "DCGM_FI_DEV_GPU_UTIL": gpu.utilization,
                "DCGM_FI_DEV_POWER_USAGE": gpu.power_w,
                "DCGM_FI_DEV_GPU_TEMP": gpu.temperature,
                "gpupool_gpu_healthy": 1 if gpu.healthy else 0,
            }
            for name, value in readings.items():
                if value is not None:  # a reading the device does not give is left out
                    families[name].add_metric(labels, value)
        return list(families.values())

    def _jobs(self) -> list[Metric]:
        agent = self.agent
        jobs = agent.store.jobs([State.QUEUED, State.RUNNING])
        now = time.time()
        snapshot = agent.observed.snapshot
        uuids = {gpu.index: gpu.uuid for gpu in snapshot.gpus} if snapshot else {}
        totals = {gpu.index: gpu.memory_total for gpu in snapshot.gpus} if snapshot else {}
        per_gpu = agent.observed.per_gpu
        used = GaugeMetricFamily(
            "vGPU_device_memory_usage_in_bytes",
            "GPU memory a job's processes hold on one GPU (bytes, as the driver counts it)",
            labels=JOB_GPU_LABELS,
        )
        limit = GaugeMetricFamily(
            "vGPU_device_memory_limit_in_bytes",
            "A job's memory share on one GPU (bytes)",
            labels=JOB_GPU_LABELS,
        )
        compute = GaugeMetricFamily(
            "gpupool_job_compute_utilization_percent",
            "GPU utilisation of a job's processes on one GPU (percent of the GPU)",
            labels=JOB_GPU_LABELS,
        )
        compute_share = GaugeMetricFamily(
            "gpupool_job_compute_share_percent",
            "A job's compute share on one GPU (percent of the GPU)",
            labels=JOB_GPU_LABELS,
        )
        throttled = CounterMetricFamily(
            "gpupool_job_throttled_seconds",
            "Time a job's launches on one GPU were held back: sleeping for its compute cap "
            "(reason cap) or waiting for the GPU's lease while another share held it (lease)",
            labels=(*JOB_GPU_LABELS, "reason"),
        )
        refused = CounterMetricFamily(
            "gpupool_job_refused_allocations",
            "Allocations of a job on one GPU refused for passing its memory share",
            labels=JOB_GPU_LABELS,
        )
        state = GaugeMetricFamily(
            "gpupool_job_state",
            "1 for each queued or running job, labelled with its state",
            labels=("job_id", "job_name", "user", "state"),
        )
        running_ids = {job.id for job in jobs if job.state is State.RUNNING}
        self._regions = {i: p for i, p in self._regions.items() if i in running_ids}
        counts = {s: 0 for s in (State.QUEUED, State.RUNNING)}
        queued_by_priority: dict[str, int] = {"high": 0, "low": 0}
        oldest = 0.0
        for job in jobs:
            counts[job.state] += 1
            state.add_metric([str(job.id), job.name, job.user, job.state.value], 1)
            if job.state is State.QUEUED:
                queued_by_priority[job.spec.priority.value] += 1
                oldest = max(oldest, now - job.submitted_at)
                continue
            self._job_gpus(job, uuids, totals, per_gpu, (used, limit, compute, compute_share))
            self._job_counters(job, uuids, throttled, refused)
        running = GaugeMetricFamily(
            "gpupool_jobs", "Jobs by state (queued, running)", labels=("state",)
        )
        for key, count in counts.items():
            running.add_metric([key.value], count)
        queue = GaugeMetricFamily(
            "gpupool_queue_length", "Jobs waiting in the queue", labels=("priority",)
        )
        for priority, count in queued_by_priority.items():
            queue.add_metric([priority], count)
        wait = GaugeMetricFamily(
            "gpupool_queue_oldest_wait_seconds", "How long the oldest queued job has waited"
        )
        wait.add_metric([], oldest)
        draining = GaugeMetricFamily("gpupool_node_draining", "1 while the node is draining")
        draining.add_metric([], 1 if agent.draining else 0)
        over = GaugeMetricFamily(
            "gpupool_job_over_share",
            "1 for each running job the watchdog has seen over its memory share",
            labels=("job_id", "job_name", "user"),
        )
        for job in jobs:
            if job.state is State.RUNNING and job.id in agent.watchdog.flagged:
                over.add_metric([str(job.id), job.name, job.user], 1)
        strangers = GaugeMetricFamily(
            "gpupool_gpu_processes_without_job",
            "GPU processes of no job (foreign or escaped) in the watchdog's last pass",
            labels=("gpu",),
        )
        for gpu in sorted(uuids):
            count = sum(1 for p in agent.watchdog.processes if p.gpu == gpu and p.job is None)
            strangers.add_metric([str(gpu)], count)
        observed = agent.observed
        return [
            used,
            limit,
            compute,
            compute_share,
            throttled,
            refused,
            state,
            running,
            queue,
            wait,
            draining,
            over,
            strangers,
            _histogram(
                "gpupool_queue_wait_seconds",
                "Time from submission to start, for jobs started by this daemon",
                observed.queue_wait.read(),
            ),
            _histogram(
                "gpupool_scheduling_latency_seconds",
                "Time of one scheduling decision over a non-empty queue (launches not included)",
                observed.scheduling.read(),
            ),
        ]

    def _job_gpus(
        self,
        job: Job,
        uuids: dict[int, str],
        totals: dict[int, int],
        per_gpu: dict[tuple[int, int], Usage],
        families: tuple[GaugeMetricFamily, ...],
    ) -> None:
        used, limit, compute, compute_share = families
        share = round(job.spec.request().compute * 100 / MILLI_PER_GPU)
        for position, index in enumerate(job.gpus):
            labels = [str(job.id), job.name, job.user, str(index), uuids.get(index, "")]
            usage = per_gpu.get((job.id, index))
            used.add_metric(labels, usage.memory if usage else 0)
            memory = job.memory[position] if position < len(job.memory) else 0
            limit.add_metric(labels, memory or totals.get(index, 0))
            if usage is not None and usage.utilization is not None:
                compute.add_metric(labels, usage.utilization)
            compute_share.add_metric(labels, share)

    def _job_counters(
        self,
        job: Job,
        uuids: dict[int, str],
        throttled: CounterMetricFamily,
        refused: CounterMetricFamily,
    ) -> None:
        counters = self._region_counters(job, len(job.gpus))
        if counters is None:
            return
        for position, index in enumerate(job.gpus[: len(counters)]):
            labels = [str(job.id), job.name, job.user, str(index), uuids.get(index, "")]
            # the region counts per CUDA ordinal: the job sees its GPUs in job.gpus's order
            device = counters[position]
            throttled.add_metric([*labels, "cap"], device.cap_wait_seconds)
            throttled.add_metric([*labels, "lease"], device.lease_wait_seconds)
            refused.add_metric(labels, device.refused_allocations)

    def _region_counters(self, job: Job, devices: int) -> list[DeviceCounters] | None:
        """The job's counters from its accounting region (in its directory); None, and its
        samples left out, where it has none (`exclusive`, or not launched yet: the store marks a
        job running just before its launcher makes the region's directory) or it cannot be
        read."""
        if job.spec.mode is Mode.EXCLUSIVE:
            return None
        path = self._regions.get(job.id)
        if path is None:
            path = find_shared_region(self.agent.jobdir(job.id).path)
            if path is None:
                return None
            self._regions[job.id] = path
        try:
            return read_counters(path, devices)
        except ConfigError as err:
            self._report(err)
            return None


def metrics_router(agent: Agent, caller: Callable[..., Any]) -> APIRouter:
    """The /metrics route; `caller` is the app's identity dependency (the token rule on TCP)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    router = APIRouter()

    @router.get("/metrics", dependencies=[Depends(caller)])
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
