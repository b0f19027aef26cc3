"""MPS mode on a real GPU: two PyTorch jobs through the node daemon with 30 % and 70 % of the SMs.

A `gpupool serve` (state in a temporary directory) runs every job in `--mode mps` on GPU 0, so
it starts GPU 0's MPS control daemon itself, with its own pipe and log directories under that
state directory (never the system default), exactly as gpupool does in production, and quits it
when the last job leaves. Steps: a 30 %, a 70 % and a 100 % job each alone, then the 30 % and the
70 % jobs together (they wait for each other before measuring). Each job runs a 4096^2 matmul
loop for `--seconds`, then fills its memory share less 256 MiB and asks for 512 MiB more (it
must get torch.cuda.OutOfMemoryError: the shim holds the share, MPS's pinned limit is only the
backstop above it).

Target (issue 10): each job of the pair within 5 points (of the 100 % job's throughput) of what
the same percentage gives alone. It never changes the GPU's compute mode, MIG mode, clocks or
limits; MIG is not checked here. Writes a markdown table to --out.

    make -C native && PYTHONPATH=src python bench/gpu/modes.py --out modes-gpu.md
    PYTHONPATH=src python bench/gpu/modes.py --simulate 1xH100-80GB --out /tmp/dry.md

`--simulate SPEC` is the dry run: the same daemon and steps on a simulated node, where the MPS
control daemon is gpupool's twin and a ctypes kernel loop stands in for PyTorch. Needs fastapi,
uvicorn and pydantic (the daemon's own dependencies).
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

from gpupool.agent.mps import control_command
from gpupool.api.client import Client

# the daemon benchmarks' start and stop, one directory up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon_support import start_daemon, url
from job_snippets import CTYPES_CONTEXT, CTYPES_FILL, TORCH_FILL, TORCH_MATMUL

MiB = 1 << 20
TOLERANCE_POINTS = 5.0
ALONE = (30, 70, 100)
TOGETHER = (30, 70)

# argv: seconds, barrier directory, jobs to wait for, memory share in bytes
BARRIER = """
import json, os, sys, time
seconds, barrier = float(sys.argv[1]), sys.argv[2]
expected, limit = int(sys.argv[3]), int(sys.argv[4])
def wait_for_partners():
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(barrier)) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
"""

TORCH_JOB = (
    BARRIER
    + TORCH_MATMUL
    + """
wait_for_partners()
start = time.perf_counter()
count = 0
while time.perf_counter() - start < seconds:
    torch.mm(a, b, out=c)
    count += 1
    if count % 20 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
rate = count / (time.perf_counter() - start)
"""
    + TORCH_FILL
    + """
print("RESULT " + json.dumps({"rate": rate, "filled": filled, "past": past}), flush=True)
"""
)

CTYPES_JOB = (
    BARRIER
    + CTYPES_CONTEXT
    + """
module, function = ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuModuleLoadData(ctypes.byref(module), b"no device code\\0") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"matmul") == 0
wait_for_partners()
start = time.perf_counter()
count = 0
while time.perf_counter() - start < seconds:
    assert cuda.cuLaunchKernel(function, 256, 1, 1, 128, 1, 1, 0, None, None, None) == 0
    assert cuda.cuCtxSynchronize() == 0
    count += 1
rate = count / (time.perf_counter() - start)
"""
    + CTYPES_FILL
    + """
print("RESULT " + json.dumps({"rate": rate, "filled": filled, "past": past}), flush=True)
"""
)


def run_step(client: Client, root: Path, percents: tuple[int, ...], args: Any) -> list[dict]:
    """Jobs with `percents` at once (each waits for the others); each one's job and result."""
    barrier = Path(tempfile.mkdtemp(prefix="barrier-", dir=root))
    passed_env = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
    ids = []
    for percent in percents:
        argv = [str(args.seconds), str(barrier), str(len(percents)), str(args.memory_gib << 30)]
        body = {
            "argv": [sys.executable, str(root / "job.py"), *argv],
            "mode": "mps",
            "compute": percent,
            "memory": f"{args.memory_gib}GiB",
            "name": f"mps-{percent}",
            "gpu_models": [],
            "env": passed_env,
            "workdir": str(root),
        }
        ids.append(client.call("POST", "/v1/jobs", json=body)["job"]["id"])
    rows = []
    for job_id in ids:
        while (job := client.call("GET", f"/v1/jobs/{job_id}"))["state"] in ("queued", "running"):
            time.sleep(0.2)
        out = client.call("GET", f"/v1/jobs/{job_id}/logs")["data"]
        result = next(
            (json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), {}
        )
        rows.append({"job": job, "result": result})
    return rows


def quit_control_daemons(root: Path, simulated: bool) -> None:
    """Leave no MPS control daemon behind, even when a step failed half-way."""
    for pipe in (root / "state" / "mps").glob("*/pipe"):
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        subprocess.run(
            control_command(simulated), input="quit\n", text=True, env=env, timeout=30, check=False
        )


def gpu_name() -> str:
    """GPU 0's name and driver version, read-only (nvidia-smi)."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "real GPU 0"
    name, _, driver = done.stdout.strip().partition(", ")
    return f"GPU 0, {name} (driver {driver})"


def table(alone: dict[int, dict], together: dict[int, dict], args: Any) -> tuple[str, bool]:
    where = f"simulated node {args.simulate} (dry run)" if args.simulate else gpu_name()
    full = alone[100]["result"].get("rate", 0.0) or float("nan")
    lines = [
        f"gpupool daemon, `--mode mps` on {where}, {args.memory_gib} GiB share per job, "
        f"{args.seconds:g} s per step; throughput in kernels/s, percent of the 100 % job alone",
        "",
        "| share | alone | alone, % | with the other | with the other, % | difference (points) "
        "| within 5 | 512 MiB past the share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    passed = True
    for percent in TOGETHER:
        one, two = alone[percent]["result"], together[percent]["result"]
        a_rate, t_rate = one.get("rate", 0.0), two.get("rate", 0.0)
        diff = (t_rate - a_rate) * 100 / full
        within = abs(diff) <= TOLERANCE_POINTS
        capped = one.get("past") == two.get("past") == "OutOfMemoryError"
        passed = passed and within and capped
        lines.append(
            f"| {percent} % | {a_rate:.1f} | {a_rate * 100 / full:.1f} | {t_rate:.1f} | "
            f"{t_rate * 100 / full:.1f} | {diff:+.1f} | {'yes' if within else 'NO'} | "
            f"{two.get('past', 'no result')} |"
        )
    lines.append(f"| 100 % | {full:.1f} | 100.0 | | | | | {alone[100]['result'].get('past')} |")
    return "\n".join(lines) + "\n", passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--simulate", metavar="SPEC", help="dry run on a simulated node")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each job measures")
    parser.add_argument("--memory-gib", type=int, default=8, help="memory share per job, GiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-gpu-modes-") as tmp:
        root = Path(tmp)
        (root / "job.py").write_text(CTYPES_JOB if args.simulate else TORCH_JOB)
        daemon = start_daemon(root, args.simulate)
        try:
            with Client(url(root)) as client:
                alone = {p: run_step(client, root, (p,), args)[0] for p in ALONE}
                pair = run_step(client, root, TOGETHER, args)
                together = dict(zip(TOGETHER, pair, strict=True))
        finally:
            daemon.terminate()
            daemon.wait()
            quit_control_daemons(root, bool(args.simulate))
    text, passed = table(alone, together, args)
    args.out.write_text(text)
    print(text)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
