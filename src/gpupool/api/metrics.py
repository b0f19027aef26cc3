"""/metrics: Prometheus metrics built from the agent's state at each scrape.

A custom collector reads the agent's view (the last GPU snapshot, the queued and running jobs,
the scheduling histograms) when Prometheus asks, so a job that ended is simply absent from the
next scrape: nothing is registered per job, nothing leaks. It builds light families
(api/exposition.py) that the route writes in the text format itself, the same bytes as
prometheus_client at about a third of its cost. Names follow dcgm-exporter for GPUs and HAMi for a
share's memory; the rest are gpupool_*. docs/metrics.md lists them all.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpupool.agent.jobs import Job, State
from gpupool.agent.usage import Usage
from gpupool.agent.view import NodeView
from gpupool.api import elastic_metrics, service_metrics
from gpupool.api.exposition import Family, Histogram, render
from gpupool.core.errors import ConfigError
from gpupool.core.resources import Mode
from gpupool.core.units import MILLI_PER_GPU
from gpupool.devices.snapshot import GpuSnapshot
from gpupool.isolation.region import DeviceCounters, OpenRegions

MIB = 1 << 20
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
JOB_GPU_LABELS = ("job_id", "job_name", "user", "gpu", "UUID")

log = logging.getLogger(__name__)


def _gpu_labels(gpu: GpuSnapshot, host: str) -> tuple[str, ...]:
    return (str(gpu.index), gpu.uuid, f"nvidia{gpu.index}", gpu.model, host)


class AgentCollector(Collector):
    """Every metric, read from the agent's `view` at scrape time: `families()` for /metrics's
    own text format, `collect()` as prometheus_client families (a `Collector`)."""

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.host = socket.gethostname()
        self._reported: set[str] = set()
        #: each running job's accounting region, once found, and kept open while it runs
        self._regions: dict[int, Path] = {}
        self._open_regions = OpenRegions()

    def families(self) -> list[Family | Histogram]:
        up = Family("gpupool_up", "1 when the daemon could read all its state", "gauge")
        try:
            families = [*self._gpus(), *self._jobs(), *service_metrics.families(self.view.services)]
        except Exception as err:  # a store closing under a stopping daemon: say so, not crash
            self._report(err)
            up.add((), 0)
            return [up]
        up.add((), 1)
        return [up, *families]

    def collect(self) -> Iterator[Metric]:
        for family in self.families():
            yield family.to_metric()

    def _report(self, err: Exception) -> None:
        kind = type(err).__name__
        if kind not in self._reported:  # once per kind of failure, not once per scrape
            self._reported.add(kind)
            log.error("/metrics: %s: %s", kind, err)

    def _gpus(self) -> list[Family]:
        snapshot = self.view.snapshot()
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
        families = {name: Family(name, doc, "gauge", GPU_LABELS) for name, doc in dcgm.items()}
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
                    families[name].add(labels, value)
        return list(families.values())

    def _jobs(self) -> list[Family | Histogram]:
        view = self.view
        jobs = view.open_jobs()
        now = time.time()
        snapshot = view.snapshot()
        uuids = {gpu.index: gpu.uuid for gpu in snapshot.gpus} if snapshot else {}
        totals = {gpu.index: gpu.memory_total for gpu in snapshot.gpus} if snapshot else {}
        per_gpu = view.usage_per_gpu()
        used = Family(
            "vGPU_device_memory_usage_in_bytes",
            "GPU memory a job's processes hold on one GPU (bytes, as the driver counts it)",
            "gauge",
            JOB_GPU_LABELS,
        )
        limit = Family(
            "vGPU_device_memory_limit_in_bytes",
            "A job's memory share on one GPU (bytes)",
            "gauge",
            JOB_GPU_LABELS,
        )
        compute = Family(
            "gpupool_job_compute_utilization_percent",
            "GPU utilisation of a job's processes on one GPU (percent of the GPU)",
            "gauge",
            JOB_GPU_LABELS,
        )
        compute_share = Family(
            "gpupool_job_compute_share_percent",
            "A job's compute share on one GPU (percent of the GPU)",
            "gauge",
            JOB_GPU_LABELS,
        )
        throttled = Family(
            "gpupool_job_throttled_seconds",
            "Time a job's launches on one GPU were held back: sleeping for its compute cap "
            "(reason cap) or waiting for the GPU's lease while another share held it (lease)",
            "counter",
            (*JOB_GPU_LABELS, "reason"),
        )
        refused = Family(
            "gpupool_job_refused_allocations",
            "Allocations of a job on one GPU refused for passing its memory share",
            "counter",
            JOB_GPU_LABELS,
        )
        state = Family(
            "gpupool_job_state",
            "1 for each queued or running job, labelled with its state",
            "gauge",
            ("job_id", "job_name", "user", "state"),
        )
        running_ids = {job.id for job in jobs if job.state is State.RUNNING}
        self._regions = {i: p for i, p in self._regions.items() if i in running_ids}
        self._open_regions.keep(self._regions.values())
        counts = {s: 0 for s in (State.QUEUED, State.RUNNING)}
        queued_by_priority: dict[str, int] = {"high": 0, "low": 0}
        oldest = 0.0
        for job in jobs:
            counts[job.state] += 1
            state.add((str(job.id), job.name, job.user, job.state.value), 1)
            if job.state is State.QUEUED:
                queued_by_priority[job.spec.priority.value] += 1
                oldest = max(oldest, now - job.submitted_at)
                continue
            self._job_gpus(job, uuids, totals, per_gpu, (used, limit, compute, compute_share))
            self._job_counters(job, uuids, throttled, refused)
        running = Family("gpupool_jobs", "Jobs by state (queued, running)", "gauge", ("state",))
        for key, count in counts.items():
            running.add((key.value,), count)
        queue = Family("gpupool_queue_length", "Jobs waiting in the queue", "gauge", ("priority",))
        for priority, count in queued_by_priority.items():
            queue.add((priority,), count)
        wait = Family(
            "gpupool_queue_oldest_wait_seconds",
            "How long the oldest queued job has waited",
            "gauge",
        )
        wait.add((), oldest)
        draining = Family("gpupool_node_draining", "1 while the node is draining", "gauge")
        draining.add((), 1 if view.draining else 0)
        over = Family(
            "gpupool_job_over_share",
            "1 for each running job the watchdog has seen over its memory share",
            "gauge",
            ("job_id", "job_name", "user"),
        )
        for job in jobs:
            if job.state is State.RUNNING and view.over_share(job.id):
                over.add((str(job.id), job.name, job.user), 1)
        strangers = Family(
            "gpupool_gpu_processes_without_job",
            "GPU processes of no job (foreign or escaped) in the watchdog's last pass, "
            "neither graphics only nor exempt",
            "gauge",
            ("gpu",),
        )
        processes = view.processes()
        for gpu in sorted(uuids):
            count = sum(1 for p in processes if p.gpu == gpu and p.stranger)
            strangers.add((str(gpu),), count)
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
            *elastic_metrics.families(view, jobs),
            Histogram(
                "gpupool_queue_wait_seconds",
                "Time from submission to start, for jobs started by this daemon",
                view.queue_wait(),
            ),
            Histogram(
                "gpupool_scheduling_latency_seconds",
                "Time of one scheduling decision over a non-empty queue (launches not included)",
                view.scheduling_latency(),
            ),
        ]

    def _job_gpus(
        self,
        job: Job,
        uuids: dict[int, str],
        totals: dict[int, int],
        per_gpu: Mapping[tuple[int, int], Usage],
        families: tuple[Family, ...],
    ) -> None:
        used, limit, compute, compute_share = families
        # the spec's compute is its request's (exclusive: MILLI_PER_GPU, as JobSpec checks);
        # request() would parse the memory share again, for every job at every scrape
        share = round(job.spec.compute * 100 / MILLI_PER_GPU)
        for position, index in enumerate(job.gpus):
            labels = (str(job.id), job.name, job.user, str(index), uuids.get(index, ""))
            usage = per_gpu.get((job.id, index))
            used.add(labels, usage.memory if usage else 0)
            memory = job.memory[position] if position < len(job.memory) else 0
            limit.add(labels, memory or totals.get(index, 0))
            if usage is not None and usage.utilization is not None:
                compute.add(labels, usage.utilization)
            compute_share.add(labels, share)

    def _job_counters(
        self, job: Job, uuids: dict[int, str], throttled: Family, refused: Family
    ) -> None:
        counters = self._region_counters(job, len(job.gpus))
        if counters is None:
            return
        for position, index in enumerate(job.gpus[: len(counters)]):
            labels = (str(job.id), job.name, job.user, str(index), uuids.get(index, ""))
            # the region counts per CUDA ordinal: the job sees its GPUs in job.gpus's order
            device = counters[position]
            throttled.add((*labels, "cap"), device.cap_wait_seconds)
            throttled.add((*labels, "lease"), device.lease_wait_seconds)
            refused.add(labels, device.refused_allocations)

    def _region_counters(self, job: Job, devices: int) -> list[DeviceCounters] | None:
        """The job's counters from its accounting region (in its directory); None, and its
        samples left out, where it has none (`exclusive`, or not launched yet: the store marks a
        job running just before its launcher makes the region's directory) or it cannot be
        read."""
        if job.spec.mode is Mode.EXCLUSIVE:
            return None
        path = self._regions.get(job.id)
        if path is None:
            path = self.view.shared_region(job.id)
            if path is None:
                return None
            self._regions[job.id] = path
        try:
            return self._open_regions.read(path, devices)
        except ConfigError as err:
            self._report(err)
            return None


def metrics_router(view: NodeView, caller: Callable[..., Any]) -> APIRouter:
    """The /metrics route; `caller` is the app's identity dependency (the token rule on TCP)."""
    collector = AgentCollector(view)
    router = APIRouter()

    @router.get("/metrics", dependencies=[Depends(caller)])
    def metrics() -> Response:
        return Response(render(collector.families()), media_type=CONTENT_TYPE_LATEST)

    return router
