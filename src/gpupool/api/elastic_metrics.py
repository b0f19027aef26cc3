"""/metrics of elastic memory: suspended jobs, their bytes in host memory, low jobs' bursts
(from the queue loop's last reading of each job's region: a scrape reads no file for them)."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.agent.jobs import Job, State
from gpupool.agent.view import NodeView
from gpupool.api.exposition import Family

LABELS = ("job_id", "job_name", "user")


def families(view: NodeView, jobs: Sequence[Job]) -> list[Family]:
    """gpupool_job_suspended, gpupool_job_host_memory_bytes and gpupool_job_burst_bytes."""
    suspended = Family(
        "gpupool_job_suspended",
        "1 for each running job suspended (or being suspended, or resuming) to host memory",
        "gauge",
        (*LABELS, "state"),
    )
    host = Family(
        "gpupool_job_host_memory_bytes",
        "Bytes of a suspended job's GPU memory now in host memory",
        "gauge",
        LABELS,
    )
    burst = Family(
        "gpupool_job_burst_bytes",
        "Bytes a low job holds past its memory share (its burst), on the GPU or in host memory",
        "gauge",
        (*LABELS, "where"),
    )
    for job in jobs:
        shown = view.elastic(job.id) if job.state is State.RUNNING else None
        if shown is None:
            continue
        labels = (str(job.id), job.name, job.user)
        if shown["state"] != "running":
            suspended.add((*labels, shown["state"]), 1)
            host.add(labels, shown["host_bytes"])
        if job.spec.memory_burst:
            on_gpu = shown["burst_on_device"]
            burst.add((*labels, "gpu"), on_gpu)
            burst.add((*labels, "host"), max(0, shown["burst_bytes"] - on_gpu))
    return [suspended, host, burst]
