"""Checks and measures the interception library (mode `shim`) on a real NVIDIA GPU with PyTorch.

Every check runs PyTorch in a child process with the library preloaded, as `gpupool exec` runs a
workload, and reports JSON back:

- memory: the cap is hit exactly (torch.cuda.OutOfMemoryError, which torch.OutOfMemoryError
  names too, one allocation past it),
  torch.cuda.mem_get_info shows the share, a second process of the share uses the same budget;
- compute: throughput under 25/50/75 % shares over exclusive throughput, for a matmul loop and
  a CUDA-graph loop (target: within 5 points);
- overhead: a launch-bound loop of tiny kernels with and without the library (target: <= 2 %),
  and with the compute arbiter engaged (target: <= 5 %);
- PyTorch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the cuMemCreate path).

It never changes the GPU's modes, clocks or limits. Writes a markdown table to --out.

    python bench/gpu/isolation.py --out docs/benchmarks/isolation-gpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.devices.factory import open_backend
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    Registration,
    prepare_dir,
    start_arbiter,
)
from gpupool.isolation.libraries import shim_library

MiB = 1 << 20
GiB = 1 << 30
SHARES = (25, 50, 75)
TOLERANCE_POINTS = 5.0
OVERHEAD_TARGET_PERCENT = 2.0
ARBITER_OVERHEAD_TARGET_PERCENT = 5.0

PRELUDE = """
import json, sys, time
import torch
def report(**values):
    print("RESULT " + json.dumps(values), flush=True)
"""

MEMORY_CAP = """
limit = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
# PyTorch rounds large allocations to 2 MiB: the limit is a multiple of it, so these fill it
first = torch.empty(limit - 64 * 2**20, dtype=torch.uint8, device="cuda")
rest = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
free_full, _ = torch.cuda.mem_get_info()
try:
    torch.empty(2 * 2**20, dtype=torch.uint8, device="cuda")
    past = "allocated"
except torch.cuda.OutOfMemoryError:
    past = "OutOfMemoryError"
report(total=total, free=free, free_full=free_full, past=past)
"""

HOLDER = """
held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
report(held=held.numel())
sys.stdin.readline()
"""

SECOND = """
free, total = torch.cuda.mem_get_info()
try:
    torch.empty(free + 2 * 2**20, dtype=torch.uint8, device="cuda")
    over = "allocated"
except torch.cuda.OutOfMemoryError:
    over = "OutOfMemoryError"
torch.cuda.empty_cache()
fits = torch.empty(free, dtype=torch.uint8, device="cuda")
report(free=free, total=total, over=over, fits=fits.numel())
"""

MATMUL = """
seconds, graph = float(sys.argv[1]), sys.argv[2] == "graph"
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
step = lambda: torch.mm(a, b, out=c)
c = torch.empty_like(a)
if graph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(4):
            step()
    step = g.replay
for _ in range(10):
    step()
torch.cuda.synchronize()
start = time.perf_counter()
count = 0
while time.perf_counter() - start < seconds:
    step()
    count += 1
torch.cuda.synchronize()
report(per_second=count / (time.perf_counter() - start))
"""

LAUNCH_BOUND = """
n = int(sys.argv[1])
x = torch.zeros(1, device="cuda")
for _ in range(1000):
    x.add_(1)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(n):
    x.add_(1)
torch.cuda.synchronize()
report(ns_per_launch=(time.perf_counter() - start) * 1e9 / n)
"""

EXPANDABLE = """
limit = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
blocks = []
try:
    while True:
        blocks.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    pass
held = sum(t.numel() for t in blocks)
del blocks
torch.cuda.empty_cache()
again = torch.empty(limit // 2, dtype=torch.uint8, device="cuda")
report(total=total, held=held, again=again.numel())
"""


@dataclass
class Check:
    name: str
    expected: str
    measured: str
    ok: bool


class Runner:
    """Runs PyTorch snippets in child processes, with or without the library."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.shim = str(shim_library())

    def env(self, shim: bool = True, region: str | None = None, **gpupool: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if shim:
            env["LD_PRELOAD"] = self.shim
            env["GPUPOOL_SHARED_REGION"] = region or str(self.work / f"region-{uuid.uuid4().hex}")
            env.update({f"GPUPOOL_{k}": v for k, v in gpupool.items()})
        return env

    @staticmethod
    def argv(snippet: str, *args: object) -> list[str]:
        code = PRELUDE + textwrap.dedent(snippet)
        return [sys.executable, "-c", code, *map(str, args)]

    def run(self, snippet: str, env: dict[str, str], *args: object) -> dict[str, Any]:
        proc = subprocess.run(
            self.argv(snippet, *args), env=env, capture_output=True, text=True, timeout=600
        )
        return parse(proc.stdout, proc.stderr)

    def start(self, snippet: str, env: dict[str, str], *args: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(snippet, *args),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def parse(stdout: str, stderr: str) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"the check's child process failed:\n{stderr[-3000:]}")


def gib(n: float) -> str:
    return f"{n / GiB:.3f} GiB"


def memory_checks(runner: Runner, limit: int) -> list[Check]:
    env = runner.env(MEMORY_LIMIT=str(limit))
    r = runner.run(MEMORY_CAP, env, limit)
    checks = [
        Check("mem_get_info total = share", gib(limit), gib(r["total"]), r["total"] == limit),
        Check("mem_get_info free (fresh)", gib(limit), gib(r["free"]), r["free"] == limit),
        Check("limit filled exactly: free", "0 GiB", gib(r["free_full"]), r["free_full"] == 0),
        Check(
            "2 MiB past the limit", "OutOfMemoryError", r["past"], r["past"] == "OutOfMemoryError"
        ),
    ]
    region = str(runner.work / f"region-{uuid.uuid4().hex}")
    shared = runner.env(region=region, MEMORY_LIMIT=str(limit))
    holder = runner.start(HOLDER, shared, limit // 2)
    try:
        assert holder.stdout is not None
        first_line = holder.stdout.readline()
        if not first_line.startswith("RESULT "):
            _, err = holder.communicate(timeout=120)
            parse(first_line, err)  # raises with the holder's error
        second = runner.run(SECOND, shared)
    finally:
        if holder.poll() is None:
            holder.communicate("done\n", timeout=120)
    left = limit - limit // 2
    checks += [
        Check(
            "2nd process: free = share - 1st's",
            gib(left),
            gib(second["free"]),
            second["free"] == left,
        ),
        Check(
            "2nd process: past the budget",
            "OutOfMemoryError",
            second["over"],
            second["over"] == "OutOfMemoryError",
        ),
        Check("2nd process: the rest fits", gib(left), gib(second["fits"]), second["fits"] == left),
    ]
    return checks


def compute_checks(runner: Runner, seconds: float) -> list[Check]:
    checks = []
    for kind, label in (("plain", "matmul loop"), ("graph", "CUDA-graph loop")):
        exclusive = runner.run(MATMUL, runner.env(shim=False), seconds, kind)["per_second"]
        for share in SHARES:
            env = runner.env(COMPUTE_LIMIT=str(share))
            rate = runner.run(MATMUL, env, seconds, kind)["per_second"]
            measured = 100 * rate / exclusive
            checks.append(
                Check(
                    f"{label} at {share} % (throughput / exclusive)",
                    f"{share} % ± 5",
                    f"{measured:.1f} %",
                    abs(measured - share) <= TOLERANCE_POINTS,
                )
            )
    return checks


def overhead_checks(runner: Runner, launches: int, repeat: int) -> list[Check]:
    """The loop without the library, with a memory share only, and with the compute arbiter
    engaged (a priority puts every launch batch through the GPU's lease and event timing, as a
    share next to others does; alone here, so the throughputs compare)."""
    sides: dict[str, list[float]] = {"without": [], "memory": [], "arbiter": []}
    # the trusted arbiter, private to this check, with the share registered as a launch does
    arbiter_dir = runner.work / "arbiter"
    prepare_dir(arbiter_dir)
    arbiter_pid = start_arbiter(arbiter_dir, runner.work / "arbiter.log")
    control = ArbiterControl(arbiter_dir)
    share = ArbiterShare.new()
    backend = open_backend(None)
    try:
        gpu = backend.snapshot().gpus[0].uuid
    finally:
        backend.close()
    control.register(Registration(share, os.getuid(), (gpu,), 100, "high"))
    try:
        for _ in range(repeat):  # alternate, so drifts in clocks hit every side alike
            envs = {
                "without": runner.env(shim=False),
                "memory": runner.env(MEMORY_LIMIT=str(8 * GiB)),
                "arbiter": runner.env(
                    MEMORY_LIMIT=str(8 * GiB),
                    COMPUTE_PRIORITY="high",
                    ARBITER_DIR=str(arbiter_dir),
                    ARBITER_SHARE=share.setting,
                ),
            }
            for side, env in envs.items():
                sides[side].append(runner.run(LAUNCH_BOUND, env, launches)["ns_per_launch"])
    finally:
        control.close()
        os.kill(arbiter_pid, signal.SIGTERM)
    base = statistics.median(sides["without"])
    checks = []
    for side, name, target in (
        ("memory", "launch-bound loop overhead (tiny kernels)", OVERHEAD_TARGET_PERCENT),
        ("arbiter", "the same, compute arbiter engaged", ARBITER_OVERHEAD_TARGET_PERCENT),
    ):
        lib = statistics.median(sides[side])
        percent = 100 * (lib - base) / base
        checks.append(
            Check(
                name,
                f"<= {target:g} %",
                f"{percent:+.2f} % ({base:.0f} -> {lib:.0f} ns per launch)",
                percent <= target,
            )
        )
    return checks


def expandable_checks(runner: Runner, limit: int) -> list[Check]:
    env = runner.env(MEMORY_LIMIT=str(limit))
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    r = runner.run(EXPANDABLE, env, limit)
    return [
        Check(
            "expandable_segments: mem_get_info total",
            gib(limit),
            gib(r["total"]),
            r["total"] == limit,
        ),
        Check(
            "expandable_segments: filled up to the limit",
            f"<= {gib(limit)}",
            gib(r["held"]),
            limit - 512 * MiB <= r["held"] <= limit,
        ),
        Check(
            "expandable_segments: reuse after free",
            gib(limit // 2),
            gib(r["again"]),
            r["again"] == limit // 2,
        ),
    ]


def device_name() -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; print(torch.cuda.get_device_name(0), torch.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def markdown(device: str, command: str, checks: list[Check]) -> str:
    lines = [
        "# Interception library on a real GPU",
        "",
        f"Device and PyTorch: {device}",
        "",
        f"Command: `{command}`",
        "",
        "| check | expected | measured | ok |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c.name} | {c.expected} | {c.measured} | {'yes' if c.ok else 'NO'} |" for c in checks
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--limit", default=4 * GiB, type=int, help="memory share in bytes")
    parser.add_argument("--seconds", default=3.0, type=float, help="length of each compute run")
    parser.add_argument("--launches", default=200_000, type=int, help="launches per overhead run")
    parser.add_argument("--repeat", default=5, type=int, help="overhead runs per side")
    args = parser.parse_args()
    if args.limit % (4 * MiB) != 0 or args.limit < 256 * MiB:
        # PyTorch rounds large allocations to 2 MiB; the checks split the limit in halves
        parser.error("--limit must be a multiple of 4 MiB, at least 256 MiB")
    with tempfile.TemporaryDirectory(prefix="gpupool-gpu-check-") as tmp:
        runner = Runner(Path(tmp))
        checks = memory_checks(runner, args.limit)
        checks += expandable_checks(runner, args.limit)
        checks += compute_checks(runner, args.seconds)
        checks += overhead_checks(runner, args.launches, args.repeat)
    command = " ".join(["python bench/gpu/isolation.py", *sys.argv[1:]])
    text = markdown(device_name(), command, checks)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
