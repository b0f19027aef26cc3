"""Compute shares on one GPU, run as users run them: every workload through `gpupool exec`.

- launch paths: a CUDA C++ program built here with nvcc (spin.cu: `<<<...>>>`, then
  cudaDeviceSynchronize(), in a loop), static and shared CUDA runtime, with and without an
  allocation first, CUDA_MODULE_LOADING EAGER and LAZY, under a 25 % cap: its GPU share, and the
  launches the library saw and held per entry point (GPUPOOL_LOG_LEVEL=info), so a missed launch
  path shows up as a count, not only as a timing, with the private driver tables
  (cuGetExportTable) the runtime fetched;
- long kernels of 20, 50 and 200 ms under a 25 % cap;
- shares busy together (PyTorch 4096^2 matmul loops): 30/70, 10/90, four of 25 %, and the `share`
  policy with its partner idle and busy: each one's throughput over exclusive throughput;
- a high-priority request loop (a small PyTorch model, one request at a time, 2 ms between
  requests) alone and next to a busy low-priority matmul loop: its p99 latency, and how much of
  the GPU time it leaves idle the low share gets.

Targets (issue 8): each within 5 points of its share; the GPU at least 90 % busy in total for a
pair; a `share` share alone at 90 % or more; the high loop's p99 within 10 % of alone, the low
share at least half of what the high one leaves. About 5 minutes on a GPU with the defaults.

It never changes the GPU's modes, clocks or limits. `--simulate` runs the same steps on the
simulated driver (a C stand-in for the nvcc program and for PyTorch, kernels of the same length),
so the script is never run blind on the GPU. `--only paths|together|priority` runs one group
(the priority pair alone takes about a minute on a GPU). Only the launch paths need nvcc;
without it on PATH they exit 4, nothing checked, as devices_check.py without a driver:

    PYTHONPATH=src python bench/gpu/compute_together.py --out compute.md
    PYTHONPATH=src python bench/gpu/compute_together.py --simulate --out compute-sim.md
    PYTHONPATH=src python bench/gpu/compute_together.py --only priority --out priority.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# sibling of this script: on sys.path when it runs
from job_snippets import TORCH_MATMUL

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOLERANCE_POINTS = 5.0
LAUNCH_SHARE = 25
LONG_KERNELS_MS = (20, 50, 200)
PAIRS = ((30, 70), (10, 90), (25, 25, 25, 25))

MATMUL = (
    """
import json, sys, time
seconds = float(sys.argv[1])
"""
    + TORCH_MATMUL
    + """
start = time.perf_counter()
began = time.monotonic()
count = 0
marks = []
while time.perf_counter() - start < seconds:
    if not marks or time.monotonic() - marks[-1][0] >= 0.05:
        marks.append([time.monotonic(), count])
    torch.mm(a, b, out=c)
    count += 1
torch.cuda.synchronize()
result = {"kernels": count, "seconds": time.perf_counter() - start}
print("RESULT " + json.dumps(result | {"start": began, "end": time.monotonic(), "marks": marks}))
"""
)

REQUESTS = """
import json, sys, time
import torch
seconds, think = float(sys.argv[1]), float(sys.argv[2]) / 1000
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda().eval()
x = torch.randn(64, 2048, device="cuda")
latencies = []
with torch.no_grad():
    for _ in range(20):
        model(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    began = time.monotonic()
    while time.perf_counter() - start < seconds:
        asked = time.perf_counter()
        model(x)
        torch.cuda.synchronize()
        latencies.append(time.perf_counter() - asked)
        time.sleep(think)
elapsed = time.perf_counter() - start
latencies.sort()
p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1e3
result = {"kernels": len(latencies), "seconds": elapsed, "p99_ms": p99}
result |= {"start": began, "end": time.monotonic()}
print("RESULT " + json.dumps(result | {"busy_ms": sum(latencies) * 1e3}))
"""
#: idle time between two requests of the high-priority loop, ms (and, simulated, a request's time)
THINK_MS = 2.0
P99_TARGET = 1.10
#: the groups of cases `--only` picks from
CASES = ("paths", "together", "priority")

_LAUNCHES = re.compile(r"gpupool\[\d+\]: launches seen: (.*)")
_EXPORT_TABLE = re.compile(r"gpupool\[\d+\]: cuGetExportTable\(")
_ENTRY = re.compile(r"(\w+) (\d+) \((\d+) held\)")


@dataclass
class Outcome:
    """One workload's result: its GPU share in percent, and the library's launch counts."""

    percent: float
    seen: int
    held: int
    entries: str


@dataclass
class Row:
    case: str
    expected: str
    measured: str
    ok: bool


class Bench:
    """Builds the programs and runs workloads through `gpupool exec`, real or simulated."""

    def __init__(self, work: Path, simulate: bool) -> None:
        self.work = work
        self.simulate = simulate
        self.node = work / "node"
        self.programs = self._build()
        self.exclusive_rate = 0.0

    def _build(self) -> dict[str, Path]:
        if self.simulate:
            out = self.work / "spin_sim"
            sim = REPO / "src" / "gpupool" / "_native" / "sim"
            cmd = ["gcc", "-O2", f"-I{REPO / 'native' / 'include'}", "-o", str(out)]
            cmd += [str(HERE / "spin_sim.c"), f"-L{sim}", "-l:libcuda.so.1"]
            subprocess.run(cmd, check=True)
            self._gpupool([], ["true"], {}, create=True).wait()
            return {"static": out, "shared": out}
        programs = {}
        for cudart in ("static", "shared"):
            out = self.work / f"spin_{cudart}"
            cmd = ["nvcc", "-O2", "-arch=native", "--cudart", cudart, "-o", str(out)]
            cmd.append(str(HERE / "spin.cu"))
            subprocess.run(cmd, check=True)
            programs[cudart] = out
        return programs

    def _gpupool(
        self, options: Sequence[str], argv: Sequence[str], env: dict[str, str], create: bool = False
    ) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "gpupool", "exec"]
        if self.simulate:
            cmd += ["--simulate", "1xH100", "--node-dir", str(self.node)] if create else []
            cmd += [] if create else ["--node-dir", str(self.node)]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        full_env["PYTHONPATH"] = str(REPO / "src")
        full_env["GPUPOOL_LOG_LEVEL"] = "info"
        full_env.update(env)
        return subprocess.Popen(
            [*cmd, *options, "--", *argv],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def start(
        self,
        compute: int | None,
        argv: Sequence[str],
        ms: float,
        policy: str = "cap",
        priority: str | None = None,
        **env: str,
    ) -> subprocess.Popen[str]:
        options = ["--compute", str(compute), "--compute-policy", policy] if compute else []
        options += ["--priority", priority] if priority else []
        if self.simulate:
            env["GPUPOOL_SIM_KERNEL_NS"] = str(int(ms * 1e6))
        return self._gpupool(options, argv, env)

    def spin(self, cudart: str, ms: float, seconds: float, alloc: bool) -> list[str]:
        return [str(self.programs[cudart]), str(ms), str(seconds), *(["alloc"] if alloc else [])]

    def busy_loop(self, seconds: float) -> list[str]:
        """The workload of the shares-together runs: PyTorch, or the stand-in launching 1 ms
        kernels without waiting (as PyTorch does)."""
        if self.simulate:
            return [str(self.programs["static"]), "1", str(seconds), "async"]
        return [sys.executable, "-c", MATMUL, str(seconds)]


def finish(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    stdout, stderr = proc.communicate(timeout=900)
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result, stderr
    raise RuntimeError(f"a workload failed (exit {proc.returncode}):\n{stderr[-3000:]}")


def rate_between(result: dict[str, Any], start: float, end: float) -> float:
    """A busy loop's kernels per second between two times (of another workload's run), from its
    marks: the low share ran alone before and after the high one, which must not count."""
    marks = [(float(t), int(n)) for t, n in result["marks"]]
    inside = [(t, n) for t, n in marks if start <= t <= end]
    if len(inside) < 2:
        raise RuntimeError("the busy loop did not run all through the other workload's run")
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def launches(stderr: str) -> tuple[int, int, str]:
    """Launches seen and held, over every entry point, from the library's report at exit."""
    seen = held = 0
    text = ""
    for match in _LAUNCHES.finditer(stderr):
        text = match.group(1)
        for _, n, h in _ENTRY.findall(text):
            seen, held = seen + int(n), held + int(h)
    # private driver tables a runtime fetched: where a launch none of the counts saw came from
    tables = len(_EXPORT_TABLE.findall(stderr))
    return seen, held, text.strip() + (f"; {tables} export tables fetched" if tables else "")


def spin_outcome(proc: subprocess.Popen[str]) -> Outcome:
    result, stderr = finish(proc)
    percent = 100.0 * result["kernels"] * result["ms"] / (result["seconds"] * 1000.0)
    return Outcome(percent, *launches(stderr))


def path_rows(bench: Bench, seconds: float, long_seconds: float) -> list[Row]:
    rows = []
    cases = [
        (cudart, 1.0, alloc, loading, seconds)
        for cudart in ("static", "shared")
        for alloc in (False, True)
        for loading in ("EAGER", "LAZY")
    ]
    cases += [("static", float(ms), False, "LAZY", long_seconds) for ms in LONG_KERNELS_MS]
    cases += [("shared", 50.0, True, "EAGER", long_seconds)]
    for cudart, ms, alloc, loading, secs in cases:
        proc = bench.start(
            LAUNCH_SHARE,
            bench.spin(cudart, ms, secs, alloc),
            ms,
            CUDA_MODULE_LOADING=loading,
        )
        out = spin_outcome(proc)
        ok = abs(out.percent - LAUNCH_SHARE) <= TOLERANCE_POINTS and out.seen == out.held > 0
        name = f"nvcc {cudart} cudart, {ms:g} ms kernels, {'alloc, ' if alloc else ''}{loading}"
        rows.append(
            Row(
                name,
                f"{LAUNCH_SHARE} ± {TOLERANCE_POINTS:g} %, every launch held",
                f"{out.percent:.1f} %; launches: {out.entries or 'none seen'}",
                ok,
            )
        )
    return rows


def together(bench: Bench, shares: Sequence[int], seconds: float, policy: str) -> list[float]:
    """Each share's throughput over exclusive throughput, in percent, all busy at once."""
    procs = [bench.start(s, bench.busy_loop(seconds), 1.0, policy) for s in shares]
    results = [finish(p)[0] for p in procs]
    return [100.0 * r["kernels"] / r["seconds"] / bench.exclusive_rate for r in results]


def measure_exclusive(bench: Bench, seconds: float) -> None:
    """The busy loop's throughput alone on the GPU: what every share's throughput is over."""
    result, _ = finish(bench.start(None, bench.busy_loop(seconds), 1.0))
    bench.exclusive_rate = result["kernels"] / result["seconds"]


def together_rows(bench: Bench, seconds: float) -> list[Row]:
    rows = []
    for shares in PAIRS:
        got = together(bench, shares, seconds, "cap")
        ok = all(abs(g - s) <= TOLERANCE_POINTS for g, s in zip(got, shares, strict=True))
        total = sum(got)
        ok = ok and (len(shares) > 2 or total >= 90.0)
        rows.append(
            Row(
                f"cap {'/'.join(map(str, shares))} busy together",
                "each ± 5 points" + ("; total ≥ 90 %" if len(shares) == 2 else ""),
                " / ".join(f"{g:.1f}" for g in got) + f" % (total {total:.1f} %)",
                ok,
            )
        )
    (alone,) = together(bench, (30,), seconds, "share")
    rows.append(Row("share 30, partner idle", "≥ 90 %", f"{alone:.1f} %", alone >= 90.0))
    got = together(bench, (30, 70), seconds, "share")
    ok = all(abs(g - s) <= TOLERANCE_POINTS for g, s in zip(got, (30, 70), strict=True))
    rows.append(
        Row("share 30/70 busy together", "each ± 5 points", " / ".join(f"{g:.1f}" for g in got), ok)
    )
    return rows


def requests(bench: Bench, seconds: float) -> list[str]:
    """A request loop, one request at a time with THINK_MS idle between requests."""
    if bench.simulate:
        return [str(bench.programs["static"]), str(THINK_MS), str(seconds), "requests"]
    return [sys.executable, "-c", REQUESTS, str(seconds), str(THINK_MS)]


def priority_rows(bench: Bench, seconds: float) -> list[Row]:
    """A high-priority request loop alone, then next to a busy low-priority share."""
    if bench.exclusive_rate == 0.0:
        measure_exclusive(bench, seconds)
    alone, _ = finish(bench.start(None, requests(bench, seconds), THINK_MS, priority="high"))
    low = bench.start(None, bench.busy_loop(seconds + 2.0), 1.0, priority="low")
    beside, _ = finish(bench.start(None, requests(bench, seconds), THINK_MS, priority="high"))
    low_result, _ = finish(low)
    busy_ms = alone["busy_ms"] if "busy_ms" in alone else alone["kernels"] * alone["ms"]
    busy = busy_ms / (alone["seconds"] * 1000.0)
    low_share = 100.0 * rate_between(low_result, beside["start"], beside["end"])
    low_share /= bench.exclusive_rate
    left = 100.0 * (1.0 - busy)
    ratio = beside["p99_ms"] / alone["p99_ms"]
    return [
        Row(
            "high request loop next to a busy low share: p99 latency",
            f"≤ {P99_TARGET:.2f} x alone",
            f"{beside['p99_ms']:.2f} ms vs {alone['p99_ms']:.2f} ms alone ({ratio:.2f} x)",
            ratio <= P99_TARGET,
        ),
        Row(
            "low share beside it: GPU time it gets of what high leaves",
            "≥ 50 %",
            f"{low_share:.1f} % of the GPU, high left {left:.1f} % idle",
            low_share >= 0.5 * left,
        ),
    ]


def device_name(simulate: bool) -> str:
    if simulate:
        return "simulated H100 (gpupool's simulated driver; a dry run of the GPU steps)"
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 else "unknown GPU"


def markdown(device: str, command: str, rows: list[Row]) -> str:
    lines = [
        "# Compute shares together",
        "",
        f"Device: {device}",
        "",
        f"Command: `{command}`",
        "",
        "| case | target | measured | ok |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r.case} | {r.expected} | {r.measured} | {'yes' if r.ok else 'NO'} |" for r in rows
    ]
    return "\n".join([*lines, ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--simulate", action="store_true", help="run on the simulated driver")
    parser.add_argument("--seconds", type=float, default=None, help="length of each short run")
    parser.add_argument("--long-seconds", type=float, default=None, help="long-kernel runs")
    parser.add_argument(
        "--only",
        choices=CASES,
        default=None,
        help="run one group of cases (default: all): the nvcc launch paths and long kernels, "
        "shares busy together, or the high/low priority pair",
    )
    args = parser.parse_args()
    seconds = args.seconds or (2.0 if args.simulate else 5.0)
    long_seconds = args.long_seconds or (4.0 if args.simulate else 12.0)
    if not args.simulate and args.only in (None, "paths") and shutil.which("nvcc") is None:
        # 4, as devices_check.py without a driver: nothing was checked
        print("compute_together: nvcc is not on PATH (the launch paths' program needs it)")
        return 4
    work = Path(tempfile.mkdtemp(prefix="gpupool-compute-"))
    try:
        bench = Bench(work, args.simulate)
        rows = []
        if args.only in (None, "paths"):
            rows += path_rows(bench, seconds, long_seconds)
        if args.only in (None, "together"):
            measure_exclusive(bench, 2 * seconds)
            rows += together_rows(bench, 2 * seconds)
        if args.only in (None, "priority"):
            rows += priority_rows(bench, 2 * seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = "PYTHONPATH=src python bench/gpu/compute_together.py " + " ".join(sys.argv[1:])
    text = markdown(device_name(args.simulate), command, rows)
    args.out.write_text(text)
    print(text)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
