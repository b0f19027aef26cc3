"""Overhead of the interception library per intercepted call, with and without LD_PRELOAD.

Runs bench/isolation_overhead.c (allocation, free and launch timed over many calls, best of
several rounds) on two drivers: the simulated driver, and a null driver whose calls return at
once, so that the difference is the library's own cost free of the simulated driver's noise.
Prints a markdown table and writes it, with the command, to docs/benchmarks/isolation.md.

    .venv/bin/python bench/isolation_overhead.py
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpupool.devices.sim.state import SimGpuSpec, SimState
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    Registration,
    prepare_dir,
    start_arbiter,
)
from gpupool.isolation.libraries import native_libraries

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
INCLUDE = REPO / "native" / "include"
DOC = REPO / "docs" / "benchmarks" / "isolation.md"
CALLS = ("alloc", "free", "launch", "loop")
LABELS = {
    "alloc": "cuMemAlloc_v2",
    "free": "cuMemFree_v2",
    "launch": "cuLaunchKernel",
    "loop": "launch-bound loop (per launch)",
    "arbitrated": "launch-bound loop (per launch), compute arbiter engaged",
}


@dataclass(frozen=True)
class Case:
    """One driver and one number of live allocations (the allocation table's size)."""

    driver: str
    live: int
    rounds: int
    loop_launches: int


@dataclass(frozen=True)
class Row:
    case: Case
    call: str
    without_ns: float
    with_ns: float
    pair_differences: tuple[float, ...]  # with - without, run pair by run pair

    @property
    def overhead_ns(self) -> float:
        return self.with_ns - self.without_ns


def gcc(*args: str) -> None:
    compiler = shutil.which("gcc")
    if compiler is None:
        sys.exit("isolation_overhead: gcc is needed to build the benchmark program")
    subprocess.run(
        [compiler, "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", *args], check=True
    )


def build(work: Path) -> tuple[Path, Path]:
    """The benchmark program (linked to libcuda.so.1) and the null driver's directory."""
    null_dir = work / "null"
    null_dir.mkdir()
    gcc(
        "-shared",
        "-fPIC",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        str(null_dir / "libcuda.so.1"),
        str(BENCH / "isolation_null_driver.c"),
    )
    program = work / "isolation_overhead"
    gcc("-o", str(program), str(BENCH / "isolation_overhead.c"), f"-L{null_dir}", "-l:libcuda.so.1")
    return program, null_dir


def sim_gpu(node: Path) -> str:
    state = SimState.open(node / "state.bin")
    try:
        return state.gpu(0).uuid
    finally:
        state.close()


def sim_node(work: Path) -> Path:
    node = work / "node"
    node.mkdir()
    spec = SimGpuSpec(
        f"GPU-{uuid.uuid4()}",
        "NVIDIA H100 80GB HBM3",
        "H100-80GB",
        80 << 30,
        132,
        9,
        0,
        "00000000:17:00.0",
    )
    SimState.create(node / "state.bin", [spec]).close()
    return node


def run_once(program: Path, env: dict[str, str], case: Case) -> dict[str, float]:
    out = subprocess.run(
        [str(program), str(case.live), str(case.rounds), str(case.loop_launches)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        name: float(value) for name, value in (line.split() for line in out.stdout.splitlines())
    }


def measure(program: Path, envs: dict[str, dict[str, str]], case: Case, repeat: int) -> list[Row]:
    """Median over `repeat` runs of each side's best round; the sides alternate run by run."""
    samples: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for _ in range(repeat):
        for side in ("without", "with"):
            samples[side].append(run_once(program, envs[side], case))

    def median(side: str, call: str) -> float:
        return statistics.median(sample[call] for sample in samples[side])

    def differences(call: str) -> tuple[float, ...]:
        pairs = zip(samples["without"], samples["with"], strict=True)
        return tuple(sorted(with_[call] - without[call] for without, with_ in pairs))

    return [
        Row(case, call, median("without", call), median("with", call), differences(call))
        for call in CALLS
    ]


def environments(driver_dir: Path, work: Path, node: Path | None) -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "LD_"))}
    base["LD_LIBRARY_PATH"] = str(driver_dir)
    if node is not None:
        base["GPUPOOL_SIM_NODE"] = str(node)
    shim = dict(base)
    # a share as `gpupool exec` sets one up: a memory limit and a shared accounting region
    shim["LD_PRELOAD"] = str(native_libraries().shim)
    shim["GPUPOOL_MEMORY_LIMIT"] = "40GiB"
    shim["GPUPOOL_SHARED_REGION"] = str(work / f"region-{uuid.uuid4().hex}")
    return {"without": base, "with": shim}


#: the null driver's one GPU (bench/isolation_null_driver.c's cuDeviceGetUuid)
NULL_GPU = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"


def arbitrated(
    envs: dict[str, dict[str, str]], work: Path, control: ArbiterControl, gpu: str
) -> dict[str, dict[str, str]]:
    """The same share with the trusted compute arbiter engaged: a priority puts every launch
    batch through the GPU's lease (granted by gpupool-arbiterd) and the event timing, as a share
    does next to others (alone here, so that the loop's throughput is comparable)."""
    share = ArbiterShare.new()
    control.register(Registration(share, os.getuid(), (gpu,), 100, "high"))
    arbiter = dict(envs["with"])
    arbiter["GPUPOOL_COMPUTE_PRIORITY"] = "high"
    arbiter["GPUPOOL_ARBITER_DIR"] = str(control.directory)
    arbiter["GPUPOOL_ARBITER_SHARE"] = share.setting
    arbiter["GPUPOOL_SHARED_REGION"] = str(work / f"region-{uuid.uuid4().hex}")
    return {"without": envs["without"], "with": arbiter}


def table(rows: list[Row]) -> str:
    lines = [
        "| driver | live allocations | call | without (ns) | with library (ns) | overhead (ns) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.case.driver} | {row.case.live:,} | {LABELS[row.call]} | "
            f"{row.without_ns:.1f} | {row.with_ns:.1f} | {row.overhead_ns:+.1f} |"
        )
    return "\n".join(lines)


def loop_overheads(rows: list[Row], engaged: list[Row]) -> str:
    lines = [
        "| driver | share | runs per side | launch-bound loop overhead (medians) "
        "| run-pair differences, lowest to highest |",
        "|---|---|---:|---:|---|",
    ]
    labelled = [(row, "memory limit only") for row in rows]
    labelled += [(row, "compute arbiter engaged (priority high, alone)") for row in engaged]
    for row, share in labelled:
        if row.call == "loop" and row.case.driver == "simulated":
            percent = 100 * row.overhead_ns / row.without_ns
            spread = ", ".join(f"{100 * d / row.without_ns:+.1f}" for d in row.pair_differences)
            lines.append(
                f"| {row.case.driver} | {share} | {len(row.pair_differences)} | {percent:+.1f} % "
                f"| {spread} (%) |"
            )
    return "\n".join(lines)


def compute_accuracy(work: Path, node: Path, seconds: float) -> str:
    """Throughput under compute shares over exclusive throughput, on the simulated driver."""
    client = work / "shim_client"
    gcc("-o", str(client), str(REPO / "tests" / "native" / "progs" / "shim_client.c"), "-ldl")
    env = environments(native_libraries().sim_dir, work, node)["with"]
    del env["GPUPOOL_MEMORY_LIMIT"]

    def throughput(percent: int, kind: str) -> float:
        run_env = dict(env, GPUPOOL_SHARED_REGION=str(work / f"region-{uuid.uuid4().hex}"))
        if percent < 100:
            run_env["GPUPOOL_COMPUTE_LIMIT"] = str(percent)
        out = subprocess.run(
            [str(client), "run", str(seconds), kind],
            env=run_env,
            capture_output=True,
            text=True,
            check=True,
        )
        launches, elapsed_ns = out.stdout.split()[1:3]
        return int(launches) * 1e9 / int(elapsed_ns)

    lines = [
        "| loop | share | measured (throughput / exclusive) | error (points) |",
        "|---|---:|---:|---:|",
    ]
    for kind, label in (("kernel", "kernels"), ("graph", "CUDA graph (4 kernels)")):
        exclusive = throughput(100, kind)
        for percent in (25, 50, 75):
            ratio = throughput(percent, kind) / exclusive
            lines.append(
                f"| {label} | {percent} % | {100 * ratio:.1f} % | {100 * ratio - percent:+.1f} |"
            )
    return "\n".join(lines)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per side (median)")
    parser.add_argument("--out", type=Path, default=DOC, help="markdown file to write")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each compute run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        work = Path(tmp)
        program, null_dir = build(work)
        node = sim_node(work)
        sim_dir = native_libraries().sim_dir
        cases = [
            (Case("null", 1_000, 300, 1_000), null_dir, None),
            (Case("null", 100_000, 5, 100_000), null_dir, None),
            # the simulated loop is long: its synchronisations are real sleeps, whose jitter
            # would otherwise swamp a difference of nanoseconds
            (Case("simulated", 1_000, 10, 64_000), sim_dir, node),
        ]
        rows: list[Row] = []
        engaged: list[Row] = []
        directory = work / "arbiter"
        prepare_dir(directory)
        arbiter_pid = start_arbiter(directory, None)
        control = ArbiterControl(directory)
        try:
            for case, driver_dir, case_node in cases:
                # the simulated driver's synchronisations sleep, and their jitter is larger
                # than the difference measured: more runs there
                runs = args.repeat * 3 if case.driver == "simulated" else args.repeat
                envs = environments(driver_dir, work, case_node)
                rows += measure(program, envs, case, runs)
                gpu = NULL_GPU if case_node is None else sim_gpu(case_node)
                engaged += measure(program, arbitrated(envs, work, control, gpu), case, runs)
        finally:
            control.close()
            os.kill(arbiter_pid, signal.SIGTERM)
        compute = compute_accuracy(work, node, args.seconds)
    command = " ".join(["python bench/isolation_overhead.py", *sys.argv[1:]])
    arbitrated_loops = [
        Row(r.case, "arbitrated", r.without_ns, r.with_ns, r.pair_differences)
        for r in engaged
        if r.call == "loop"
    ]
    result = f"{table(rows + arbitrated_loops)}\n\n{loop_overheads(rows, engaged)}\n"
    print(result)
    print(compute)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(command, result, compute, args.seconds))


def render(command: str, result: str, compute: str, seconds: float) -> str:
    return (
        DOC_TEMPLATE.replace("{command}", command)
        .replace("{machine}", machine())
        .replace("{result}", result.rstrip())
        .replace("{compute}", compute)
        .replace("{seconds}", f"{seconds:g}")
    )


DOC_TEMPLATE = """# Isolation benchmarks (mode `shim`)

## Cost of the interception library

Command (from the repository root, after `make native`): `{command}`

Machine: {machine}

A C program (`bench/isolation_overhead.c`) times N calls of each intercepted entry point, best of
several rounds, and the script takes the median of 5 runs per side (15 on the simulated driver),
the sides alternating: without
the library, and with it preloaded as `gpupool exec` sets up a share (a memory limit and a shared
accounting region). "null" is a driver whose calls return at once
(`bench/isolation_null_driver.c`), so the difference is the library's own cost; "simulated" is the
simulated driver, whose allocations and frees map and unmap host memory (their times vary run to
run by more than the library costs). "live allocations" is how many allocations are alive while the
calls are timed: it sizes the library's pointer table. The launch-bound loop launches one-thread
kernels and synchronises every 64 launches (64,000 launches a round on the simulated driver,
where each synchronisation is a sleep of tens of microseconds whose jitter is larger than the
library's cost: hence the spread of run pairs below); no compute share is set, so a launch only
pays the pass-through (the activity stamp of the `share` policy and a clock read).

{result}

Target: 200 ns or less per intercepted allocation on the simulated driver; 2 % or less on a
launch-bound loop (the percentage is for the simulated driver only: the null driver's launch
costs a few nanoseconds, so a percentage of it says nothing). A real driver's launch takes
microseconds, against which the library's launch pass-through is smaller still; that is what
the real-GPU check below measures.

## Compute shares on the simulated driver

Same command. `tests/native/progs/shim_client.c` launches work for {seconds} s of wall time on one
simulated GPU (a kernel of 256 x 128 threads takes 1 ms there; a graph is 4 chained kernels of
64 blocks) and synchronises; throughput is launches per second, over the same loop's throughput
with no compute share. The share is held by the duty-cycle throttle from event timings.

{compute}

Target: within 5 points of the share.

## Real GPU check

`bench/gpu/isolation.py` checks the library on a real NVIDIA GPU with PyTorch: the memory cap
hit exactly (torch.OutOfMemoryError past it, torch.cuda.mem_get_info showing the share, a second
process sharing the budget), compute accuracy for 25/50/75 % with a matmul loop and a CUDA-graph
loop, the overhead on a launch-bound loop with and without the library, and PyTorch with
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (the cuMemCreate path). It writes a markdown
table to `--out`.

No GPU was available where these numbers were taken, so the script has not been run yet. To run
it on a machine with an NVIDIA GPU, its driver and PyTorch:

```
make native
python bench/gpu/isolation.py --out docs/benchmarks/isolation-gpu.md
```
"""


if __name__ == "__main__":
    main()
