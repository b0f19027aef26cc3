"""Which daemon job uses each MIG instance, and which jobs are suspended or burst into host
memory, for `gpupool gpus` (when a daemon answers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpupool.api.client import Client, resolve_url
from gpupool.core import settings
from gpupool.core.errors import GpupoolError
from gpupool.core.units import format_bytes


def daemon_jobs(url: str | None = None) -> list[dict[str, Any]]:
    """The node daemon's queued and running jobs; empty when no daemon runs (`gpupool gpus`
    needs none, so it does not wait for or complain about one)."""
    where = resolve_url(url)
    explicit = url is not None or settings.URL.read(os.environ) is not None
    if where.startswith("unix://") and not explicit and not Path(where[7:]).exists():
        return []
    try:
        with Client(where) as client:
            return list(client.call("GET", "/v1/jobs")["jobs"])
    except GpupoolError:
        return []


def elastic_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """A line per job suspended to host memory or with a burst past its share."""
    lines = []
    for job in jobs:
        elastic = job.get("elastic") or {}
        gpus = ",".join(str(g) for g in job["gpus"])
        if elastic.get("state", "running") != "running":
            host = format_bytes(elastic["host_bytes"])
            lines.append(
                f"job {job['id']} ({job['user']}) on GPU {gpus}: {elastic['state']}, "
                f"{host} in host memory"
            )
        if elastic.get("burst_bytes"):
            on = elastic["burst_on_device"]
            lines.append(
                f"job {job['id']} ({job['user']}) on GPU {gpus}: burst "
                f"{format_bytes(elastic['burst_bytes'])}, {format_bytes(on)} on the GPU"
            )
    return lines


def mig_jobs(jobs: list[dict[str, Any]]) -> dict[str, str]:
    """MIG-UUID -> `job 7 (alice)` for the running jobs among `jobs`."""
    return {
        job["mig_uuid"]: f"job {job['id']} ({job['user']})"
        for job in jobs
        if job.get("mig_uuid") and job["state"] == "running"
    }
