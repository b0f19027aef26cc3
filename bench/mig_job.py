"""MIG jobs' start: what creating, using and destroying a 1g instance adds to a job's start.

    python bench/mig_job.py [--jobs 30]

Prints a markdown table (docs/benchmarks/modes-mig.md records it with the machine's load).
A daemon on a simulated node: GPU 0 an H100 in MIG mode with no instance, GPU 1 an H100 in MIG
mode with a 2g.20gb instance, GPU 2 an H100 without MIG. One job at a time, each a small CUDA
program (examples/cuda_job.py: it holds 64 MiB and launches kernels for 50 ms):
- shim on GPU 2 (the baseline),
- `--mig-profile 1g.10gb`: the daemon creates the instance, the job runs on it, the daemon
  destroys it after the job,
- `--mig-profile 2g.20gb`: the free instance of GPU 1 is used as it is.
For each: submit to the job's process started (its /proc start time, 1/CLK_TCK steps), and for
the 1g jobs, the job's end to its instance destroyed. The target: the 1g instance's creation
and destruction add no more than 2 s to a job's start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_support import machine_load, percentile, start_daemon, url

from gpupool.api.client import Client

TICKS = os.sysconf("SC_CLK_TCK")
CUDA_JOB = str(Path(__file__).resolve().parents[1] / "examples" / "cuda_job.py")
SPEC = """gpus:
  - model: H100
    mig: true
  - model: H100
    mig: [2g.20gb]
  - model: H100
"""


def run_one(client: Client, root: Path, share: dict[str, Any]) -> tuple[float, float | None]:
    """One job to its end: (submit to its process started, its end to its instance destroyed;
    None when no instance was destroyed), in ms."""
    body = {"argv": [sys.executable, CUDA_JOB, "0.05", "64"], "workdir": "/tmp", **share}
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    job = client.call("POST", "/v1/jobs", json=body)["job"]
    pids = root / "state" / "jobs" / str(job["id"]) / "pids.json"
    while not pids.exists():
        time.sleep(0.002)
    start_ticks = json.loads(pids.read_text())["job_start"]
    started = (start_ticks / TICKS - since_boot) * 1000
    while True:
        now = client.call("GET", f"/v1/jobs/{job['id']}")
        mig = [e for e in now["events"] if e["kind"] == "mig"]
        if now["finished_at"] is not None and (mig or "mig_profile" not in share):
            break
        time.sleep(0.005)
    if now["exit_code"] != 0:
        raise SystemExit(f"job {job['id']} failed: {now['events']}")
    destroyed = [e for e in mig if e["detail"].endswith("destroyed")]
    after = (destroyed[0]["at"] - now["finished_at"]) * 1000 if destroyed else None
    return started, after


def measure(jobs: int) -> list[str]:
    kinds = {
        "shim on a GPU without MIG (baseline)": {"compute": 50},
        "mig 1g.10gb, instance created and destroyed": {"mig_profile": "1g.10gb"},
        "mig 2g.20gb, a free instance used": {"mig_profile": "2g.20gb"},
    }
    starts: dict[str, list[float]] = {kind: [] for kind in kinds}
    destroys: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-mig-") as tmp:
        root = Path(tmp)
        (root / "spec.yaml").write_text(SPEC)
        daemon = start_daemon(root, str(root / "spec.yaml"))
        try:
            with Client(url(root)) as client:
                for _ in range(jobs):  # interleaved, so a change of load hits every kind alike
                    for kind, share in kinds.items():
                        started, destroyed = run_one(client, root, share)
                        starts[kind].append(started)
                        if destroyed is not None:
                            destroys.append(destroyed)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    rows = [
        f"| submit to the job's process started: {kind} | {jobs} jobs | p50 "
        f"{percentile(times, 50):.0f} ms, p95 {percentile(times, 95):.0f} ms, max "
        f"{max(times):.0f} ms | |"
        for kind, times in starts.items()
    ]
    base, made = (starts[k] for k in list(kinds)[:2])
    added = percentile(made, 95) - percentile(base, 50) + percentile(destroys, 95)
    rows.append(
        f"| the job's end to its 1g.10gb instance destroyed | {len(destroys)} jobs | p50 "
        f"{percentile(destroys, 50):.0f} ms, p95 {percentile(destroys, 95):.0f} ms | |"
    )
    rows.append(
        f"| added by the 1g instance: p95 start with creation - p50 baseline start + p95 "
        f"destruction | | {added:.0f} ms | <= 2000 ms |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="jobs of each kind")
    args = parser.parse_args()
    print(f"gpupool daemon on a simulated node (2 H100 in MIG mode, 1 without); {machine_load()}")
    print()
    print("| what | measured | result | target |")
    print("|---|---|---|---|")
    for row in measure(args.jobs):
        print(row)


if __name__ == "__main__":
    main()
