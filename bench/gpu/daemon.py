"""The node daemon on a real GPU: several PyTorch jobs with shim shares at once.

A `gpupool serve` (state in a temporary directory) runs `--jobs` PyTorch jobs side by side on
GPU 0, each with a memory share of `--limit-gib` GiB and an equal compute share. Each job fills
its share less 256 MiB, then asks for 512 MiB more (it must get torch.cuda.OutOfMemoryError),
then computes for a while holding its memory. Checked: every cap holds, `gpupool ps --json`
shows each job's live memory while it runs, every exit code is the job's own. It never changes
the GPU's modes, clocks or limits. Writes a markdown table to --out.

    PYTHONPATH=src python bench/gpu/daemon.py --out docs/benchmarks/daemon-gpu.md
    PYTHONPATH=src python bench/gpu/daemon.py --simulate 1xH100-80GB --out /tmp/dry.md

`--simulate SPEC` is the dry run: the same daemon and checks on a simulated node, with a ctypes
job in place of PyTorch (needs `make -C native`). Needs fastapi, uvicorn and pydantic.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpupool.api.client import Client

# the daemon benchmarks' start and stop, one directory up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon_support import start_daemon, url
from job_snippets import CTYPES_CONTEXT, CTYPES_FILL, TORCH_FILL

MiB = 1 << 20
CAP_HELD, CAP_BROKEN = 0, 3

TORCH_JOB = (
    """
import json, sys, time
limit, hold = int(sys.argv[1]), float(sys.argv[2])
"""
    + TORCH_FILL
    + """
print("RESULT " + json.dumps({"filled": filled, "past": past}), flush=True)
a = torch.randn(2048, 2048, device="cuda")
end = time.monotonic() + hold
while time.monotonic() < end:
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()
sys.exit(0 if past == "OutOfMemoryError" else 3)
"""
)

CTYPES_JOB = (
    """
import json, sys, time
limit, hold = int(sys.argv[1]), float(sys.argv[2])
"""
    + CTYPES_CONTEXT
    + CTYPES_FILL
    + """
print("RESULT " + json.dumps({"filled": filled, "past": past}), flush=True)
time.sleep(hold)
sys.exit(0 if past == "OutOfMemoryError" else 3)
"""
)


def run(args: argparse.Namespace, root: Path) -> tuple[list[dict[str, Any]], int]:
    """Each job's result and live memory, and the daemon's context reserve per job and GPU."""
    address = url(root)
    script = root / "job.py"
    script.write_text(CTYPES_JOB if args.simulate else TORCH_JOB)
    limit = args.limit_gib << 30
    compute = max(1, 100 // args.jobs)
    passed_env = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
    seen: dict[int, int] = {}
    with Client(address) as client:
        reserve = int(client.call("GET", "/v1/node")["context_reserve"])
        ids = []
        for n in range(args.jobs):
            body = {
                "argv": [sys.executable, str(script), str(limit), str(args.hold)],
                "memory": f"{args.limit_gib}GiB",
                "compute": compute,
                "name": f"job-{n}",
                "gpu_models": [],
                "env": passed_env,
                "workdir": str(root),
            }
            ids.append(client.call("POST", "/v1/jobs", json=body)["job"]["id"])
        while True:
            done = subprocess.run(
                [sys.executable, "-m", "gpupool", "ps", "--all", "--json", "--url", address],
                capture_output=True,
                text=True,
                check=True,
            )
            jobs = json.loads(done.stdout)["jobs"]
            for job in jobs:
                if job["live_memory"]:
                    seen[job["id"]] = max(seen.get(job["id"], 0), job["live_memory"])
            if all(job["state"] not in ("queued", "running") for job in jobs):
                break
            time.sleep(0.5)
        rows = []
        for job_id in ids:
            job = client.call("GET", f"/v1/jobs/{job_id}")
            out = client.call("GET", f"/v1/jobs/{job_id}/logs")["data"]
            result = next(
                (json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")),
                {},
            )
            rows.append({"job": job, "result": result, "live": seen.get(job_id, 0)})
    return rows, reserve


def table(rows: list[dict[str, Any]], reserve: int, args: argparse.Namespace) -> str:
    where = f"simulated node {args.simulate} (dry run)" if args.simulate else "real GPU 0"
    lines = [
        f"gpupool daemon, {args.jobs} jobs at once on {where}, {args.limit_gib} GiB share each, "
        f"context reserve {reserve / MiB:.0f} MiB per job",
        "",
        "| job | GPUs | state | exit code | filled before the cap | 512 MiB past the cap | "
        "max live memory in `gpupool ps` | over the share (context) | pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        job, result = row["job"], row["result"]
        ok = (
            job["exit_code"] == CAP_HELD
            and result.get("past") == "OutOfMemoryError"
            # what the driver sees may pass the share by the context, never the reserve
            and 0 < row["live"] <= (args.limit_gib << 30) + reserve
        )
        over = max(0, row["live"] - (args.limit_gib << 30))
        lines.append(
            f"| {job['name']} | {job['gpus']} | {job['state']} | {job['exit_code']} | "
            f"{result.get('filled', 0) / MiB:.0f} MiB | {result.get('past', 'no result')} | "
            f"{row['live'] / MiB:.0f} MiB | {over / MiB:.0f} MiB | {'yes' if ok else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--simulate", metavar="SPEC", help="dry run on a simulated node")
    parser.add_argument("--jobs", type=int, default=4, help="jobs at once on GPU 0")
    parser.add_argument("--limit-gib", type=int, default=4, help="memory share per job, GiB")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds each job computes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-gpu-daemon-") as tmp:
        root = Path(tmp)
        daemon = start_daemon(root, args.simulate)
        try:
            rows, reserve = run(args, root)
        finally:
            daemon.terminate()
            daemon.wait()
    text = table(rows, reserve, args)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
