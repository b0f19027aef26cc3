"""Which daemon job uses each MIG instance, for `gpupool gpus` (when a daemon answers)."""

from __future__ import annotations

import os
from pathlib import Path

from gpupool.api.client import Client, resolve_url
from gpupool.core import settings
from gpupool.core.errors import GpupoolError


def mig_jobs(url: str | None = None) -> dict[str, str]:
    """MIG-UUID -> `job 7 (alice)` for the running jobs of the node's daemon; empty when no
    daemon runs (`gpupool gpus` needs none, so it does not wait for or complain about one)."""
    where = resolve_url(url)
    explicit = url is not None or settings.URL.read(os.environ) is not None
    if where.startswith("unix://") and not explicit and not Path(where[7:]).exists():
        return {}
    try:
        with Client(where) as client:
            jobs = client.call("GET", "/v1/jobs")["jobs"]
    except GpupoolError:
        return {}
    return {
        job["mig_uuid"]: f"job {job['id']} ({job['user']})"
        for job in jobs
        if job.get("mig_uuid") and job["state"] == "running"
    }
