"""MPS mode on a real GPU: PyTorch jobs through the node daemon, 30 % + 70 %, then high beside low.

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

Then the priority pair, measured and recorded (no target): a `high` 50 % job's request loop
(one 1024^2 matmul and a synchronize per request) alone, beside a busy `low` 50 % job of
`--low-clients` processes of 4096^2 matmul loops (each process is an MPS client with the job's
50 %, so together they oversubscribe the SMs), and beside the same job at `high` (no
priorities); and the low job alone, for its share of the GPU beside the request loop.

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
import shlex
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

# the priority pair's jobs: argv seconds, barrier directory, processes to wait for
REQUESTS_TORCH = (
    BARRIER
    + """
import torch
a = torch.randn(1024, 1024, device="cuda")
b = torch.randn(1024, 1024, device="cuda")
c = torch.empty_like(a)
def request():
    torch.mm(a, b, out=c)
    torch.cuda.synchronize()
"""
)
#: after CTYPES_CONTEXT, a kernel `function` of the simulated driver (whose kernels take the time
#: their grid asks for, whatever their module)
CTYPES_FUNCTION = """
module, function = ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuModuleLoadData(ctypes.byref(module), b"no device code\\0") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"kernel") == 0
"""
REQUESTS_CTYPES = (
    BARRIER
    + CTYPES_CONTEXT
    + CTYPES_FUNCTION
    + """
def request():  # 2 ms on the whole simulated GPU
    assert cuda.cuLaunchKernel(function, 512, 1, 1, 128, 1, 1, 0, None, None, None) == 0
    assert cuda.cuCtxSynchronize() == 0
"""
)
REQUEST_LOOP = """
for _ in range(10):
    request()
wait_for_partners()
latencies = []
start = time.perf_counter()
while (began := time.perf_counter()) - start < seconds:
    request()
    latencies.append((time.perf_counter() - began) * 1000)
latencies.sort()
rate = len(latencies) / (time.perf_counter() - start)
p50, p99 = (latencies[min(len(latencies) - 1, int(f * len(latencies)))] for f in (0.5, 0.99))
print("RESULT " + json.dumps({"rate": rate, "p50_ms": p50, "p99_ms": p99}), flush=True)
"""
LONG_TORCH = (
    BARRIER
    + TORCH_MATMUL
    + """
def kernel():
    torch.mm(a, b, out=c)
def synchronize():
    torch.cuda.synchronize()
"""
)
LONG_CTYPES = (
    BARRIER
    + CTYPES_CONTEXT
    + CTYPES_FUNCTION
    + """
def kernel():  # 50 ms on the whole simulated GPU
    assert cuda.cuLaunchKernel(function, 12800, 1, 1, 128, 1, 1, 0, None, None, None) == 0
def synchronize():
    assert cuda.cuCtxSynchronize() == 0
"""
)
LONG_LOOP = """
for _ in range(3):
    kernel()
synchronize()
wait_for_partners()
start = time.perf_counter()
count = 0
while time.perf_counter() - start < seconds:
    kernel()
    count += 1
    if count % 4 == 0:
        synchronize()
synchronize()
print("RESULT " + json.dumps({"rate": count / (time.perf_counter() - start)}), flush=True)
"""
PAIR_PERCENT = 50

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


def submit(
    client: Client, root: Path, argv: list[str], percent: int, args: Any, **extra: Any
) -> int:
    passed_env = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
    body = {
        "argv": argv,
        "mode": "mps",
        "compute": percent,
        "memory": f"{args.memory_gib}GiB",
        "name": f"mps-{percent}",
        "gpu_models": [],
        "env": passed_env,
        "workdir": str(root),
        **extra,
    }
    return int(client.call("POST", "/v1/jobs", json=body)["job"]["id"])


def finish(client: Client, job_id: int) -> dict:
    """The ended job and its RESULT lines (one per process that printed one)."""
    while (job := client.call("GET", f"/v1/jobs/{job_id}"))["state"] in ("queued", "running"):
        time.sleep(0.2)
    out = client.call("GET", f"/v1/jobs/{job_id}/logs")["data"]
    results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    return {"job": job, "results": results, "result": results[0] if results else {}}


def run_step(client: Client, root: Path, percents: tuple[int, ...], args: Any) -> list[dict]:
    """Jobs with `percents` at once (each waits for the others); each one's job and result."""
    barrier = Path(tempfile.mkdtemp(prefix="barrier-", dir=root))
    ids = []
    for percent in percents:
        argv = [str(args.seconds), str(barrier), str(len(percents)), str(args.memory_gib << 30)]
        ids.append(
            submit(client, root, [sys.executable, str(root / "job.py"), *argv], percent, args)
        )
    return [finish(client, job_id) for job_id in ids]


def priority_step(client: Client, root: Path, requests: bool, low: str | None, args: Any) -> dict:
    """The high request loop (when `requests`) and the long-kernel job at priority `low` (when
    not None) at once; the rate and latencies of each that ran."""
    barrier = Path(tempfile.mkdtemp(prefix="barrier-", dir=root))
    processes = (1 if requests else 0) + (args.low_clients if low is not None else 0)
    tail = f"{args.seconds} {barrier} {processes} 0"
    ids = {}
    if low is not None:
        one = shlex.join([sys.executable, str(root / "long.py"), *tail.split()])
        script = " & ".join([one] * args.low_clients) + "; wait"
        ids["low"] = submit(client, root, ["sh", "-c", script], PAIR_PERCENT, args, priority=low)
    if requests:
        argv = [sys.executable, str(root / "requests.py"), *tail.split()]
        ids["high"] = submit(client, root, argv, PAIR_PERCENT, args, priority="high")
    ended = {name: finish(client, job_id) for name, job_id in ids.items()}
    row: dict[str, Any] = {}
    if "high" in ended:
        row.update(ended["high"]["result"])
    if "low" in ended:
        row["low_rate"] = sum(r.get("rate", 0.0) for r in ended["low"]["results"])
    return row


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


def priority_table(steps: dict[str, dict], args: Any) -> str:
    low_alone = steps["low alone"].get("low_rate", 0.0) or float("nan")
    lines = [
        "",
        f"Priority pair: a `high` {PAIR_PERCENT} % request loop beside a `low` {PAIR_PERCENT} % "
        f"job of {args.low_clients} long-kernel clients (MPS client priority 0 and 1); "
        "requests/s and latency per request in ms, the low job's kernels/s over its clients",
        "",
        "| step | requests/s | p50 | p99 | low job kernels/s | low job, % of alone |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in steps.items():
        cells = [name]
        if "rate" in row:
            cells += [f"{row['rate']:.1f}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}"]
        else:
            cells += ["", "", ""]
        if "low_rate" in row:
            cells += [f"{row['low_rate']:.1f}", f"{row['low_rate'] * 100 / low_alone:.0f}"]
        else:
            cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PRIORITY_STEPS = (
    ("high alone", True, None),
    ("low alone", False, "low"),
    ("high beside low", True, "low"),
    ("high beside the same job at high (no priorities)", True, "high"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--simulate", metavar="SPEC", help="dry run on a simulated node")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each job measures")
    parser.add_argument("--memory-gib", type=int, default=8, help="memory share per job, GiB")
    parser.add_argument(
        "--low-clients", type=int, default=2, help="processes of the priority pair's low job"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-gpu-modes-") as tmp:
        root = Path(tmp)
        (root / "job.py").write_text(CTYPES_JOB if args.simulate else TORCH_JOB)
        requests = REQUESTS_CTYPES if args.simulate else REQUESTS_TORCH
        (root / "requests.py").write_text(requests + REQUEST_LOOP)
        (root / "long.py").write_text((LONG_CTYPES if args.simulate else LONG_TORCH) + LONG_LOOP)
        daemon = start_daemon(root, args.simulate)
        try:
            with Client(url(root)) as client:
                alone = {p: run_step(client, root, (p,), args)[0] for p in ALONE}
                pair = run_step(client, root, TOGETHER, args)
                together = dict(zip(TOGETHER, pair, strict=True))
                steps = {
                    name: priority_step(client, root, requests_on, low, args)
                    for name, requests_on, low in PRIORITY_STEPS
                }
        finally:
            daemon.terminate()
            daemon.wait()
            quit_control_daemons(root, bool(args.simulate))
    text, passed = table(alone, together, args)
    text += priority_table(steps, args)
    args.out.write_text(text)
    print(text)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
