"""How `gpupool ps` and `gpupool describe` print jobs (the client only formats)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from gpupool.cli import texttable
from gpupool.cli.lines import say
from gpupool.core.units import format_bytes


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _memory(job: dict[str, Any]) -> str:
    if job["memory"] is not None:
        return format_bytes(job["memory"])
    return job["memory_request"] or "-"


def _over_share(job: dict[str, Any]) -> str:
    """The driver's figure beyond the share: mostly CUDA contexts, which the shim does not
    count and the daemon's context reserve covers."""
    if job["memory"] is None or not job["gpus"]:
        return ""
    over = job["live_memory"] - job["memory"] * len(job["gpus"])
    return f" ({format_bytes(max(0, over))} over the share)"


def _mode(job: dict[str, Any]) -> str:
    """The mode, and for an MPS job the server it is a client of (`mps:<server pid>`)."""
    server = job.get("mps_server")
    return f"{job['mode']}:{server}" if server else job["mode"]


def _row(job: dict[str, Any], now: float) -> list[str]:
    gpus = ",".join(str(g) for g in job["gpus"]) or f"({job['gpu_count']})"
    if job.get("mig_profile"):  # a MIG job's instance (mig:1g.10gb@0/7), or its profile
        gpus = job.get("mig") or f"({job['mig_profile']})"
    state = job["state"]
    if job["exit_code"] is not None and state != "succeeded":
        state += f" ({job['exit_code']})"
    if job.get("oom"):
        state += " oom"
    if job.get("over_share"):
        state += " over-share"
    elastic = job.get("elastic") or {}
    if elastic.get("state", "running") != "running":
        state = elastic["state"]  # suspended, suspending, resuming: the job still runs
    util = job.get("utilization")
    return [
        str(job["id"]),
        job["name"][:16],
        job["user"],
        state,
        gpus,
        _memory(job),
        f"{job['compute']}%",
        _mode(job),
        job["priority"],
        _age(now - job["submitted_at"]),
        _bytes(job.get("live_memory")),
        "-" if util is None else f"{util}%",
    ]


def print_jobs(jobs: list[dict[str, Any]]) -> None:
    header = [
        "ID",
        "NAME",
        "USER",
        "STATE",
        "GPUS",
        "MEM/GPU",
        "COMPUTE",
        "MODE",
        "PRIO",
        "AGE",
        "USED",
        "UTIL",
    ]
    now = time.time()
    say("\n".join(texttable.lines(header, [_row(job, now) for job in jobs])))
    if not jobs:
        say("(no jobs)")


def print_slurm_shares(shares: list[dict[str, Any]]) -> None:
    """The shares Slurm's jobs hold on this node (their shards of each GPU)."""
    header = ["SLURM JOB", "USER", "GPUS", "SHARDS", "MEM/GPU", "COMPUTE"]
    rows = [
        [
            str(share["slurm_job_id"]),
            share["user"],
            ",".join(str(g) for g in share["gpus"]),
            f"{share['shards']}/{share['shards_per_gpu']}" if share["shards"] else "whole",
            _bytes(share["memory"]),
            f"{share['compute_milli'] / 10:g}%",
        ]
        for share in shares
    ]
    say("\n".join(texttable.lines(header, rows)))


def _when(at: float | None) -> str:
    return "-" if at is None else datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]


def _elastic_lines(elastic: dict[str, Any] | None) -> list[str]:
    """Elastic memory: suspended (where its memory is), its burst."""
    if not elastic:
        return []
    lines = []
    if elastic["state"] != "running":
        why = f" ({elastic['reason']})" if elastic["reason"] else ""
        lines.append(
            f"  elastic:  {elastic['state']}{why}, {format_bytes(elastic['host_bytes'])} in "
            "host memory"
        )
    if elastic["burst_bytes"]:
        lines.append(
            f"  burst:    {format_bytes(elastic['burst_bytes'])} past the share, "
            f"{format_bytes(elastic['burst_on_device'])} of it on the GPU"
        )
    lines.extend(f"  {line}" for line in elastic["waiting"])
    return lines


def print_job(job: dict[str, Any]) -> None:
    gpus = ",".join(str(g) for g in job["gpus"]) or "not placed yet"
    models = ", ".join(job["gpu_models"]) or "any"
    lines = [
        f"job {job['id']} ({job['name']}), {job['user']}: {job['state']}"
        + (f", exit code {job['exit_code']}" if job["exit_code"] is not None else ""),
        f"  command:  {' '.join(job['command'])}",
        f"  share:    {job['gpu_count']} GPU(s), {_memory(job)} and {job['compute']}% compute each,"
        f" mode {job['mode']}, priority {job['priority']}, models {models}",
        f"  GPUs:     {gpus}",
    ]
    if job.get("mps_server"):
        lines.append(f"  MPS:      a client of the MPS server pid {job['mps_server']}")
    if job.get("mig_profile"):
        where = f"{job['mig']} ({job['mig_uuid']})" if job.get("mig") else "not placed yet"
        lines.append(f"  MIG:      {job['mig_profile']} instance: {where}")
    if job.get("live_memory") is not None:
        lines.append(
            f"  using:    {_bytes(job['live_memory'])} now{_over_share(job)},"
            f" peak {_bytes(job['peak_memory'])}"
        )
    elif job.get("peak_memory"):
        lines.append(f"  peak:     {_bytes(job['peak_memory'])}")
    if job.get("oom"):
        lines.append("  oom:      the shim refused an allocation past the share")
    if job.get("over_share"):
        lines.append(
            "  watchdog: the driver saw it over its memory share (events below; gpupool events)"
        )
    lines.extend(_elastic_lines(job.get("elastic")))
    if job.get("waiting"):
        lines.append("  waiting because:")
        lines.extend(f"    {reason}" for reason in job["waiting"])
    lines.append("  events:")
    for event in job["events"]:
        detail = f" ({event['detail']})" if event["detail"] else ""
        lines.append(f"    {_when(event['at'])}  {event['kind']}{detail}")
    say("\n".join(lines))
