"""Online requests next to another online service on one GPU, by the arbiter's time slice.

The GPU half of bench/inference_pool.py's pooling without HTTP, the router or Python servers:
one simulated GPU, its node's arbiter, two online shares (`high`, a quarter GPU each, Poisson
requests of 4 kernels of 1 ms, a synchronize after each kernel as examples/model_server.py
does) and two offline ones (`low`, batches of 16 kernels back to back), each a process of its
own through the interception library, registered as the daemon registers a service's replica.
Each online service's p50/p99 alone (its share by itself on the GPU) and pooled, with the
online shares' slice at each value given (0: the 20 ms batch window, the arbitration before
slices); the configurations alternate round by round so that the machine's load falls on all.

Usage: python bench/arbiter_slices.py [--seconds S] [--rounds N] [--slices 0,2000,...]
       (a worker: python bench/arbiter_slices.py --worker online|offline SECONDS [RATE SEED])
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpupool.core.resources import Priority
from gpupool.devices.sim.node import SimNode
from gpupool.devices.sim.spec import parse_spec
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    prepare_dir,
    start_arbiter,
)
from gpupool.isolation.launch import ShareLimits, build_launch_spec, new_shared_region

#: online services: name -> requests/s (chat and search share a GPU in inference_pool.py)
ONLINE = {"chat": 12.0, "search": 8.0}
OFFLINE = ("score-a", "score-b")
KERNEL_NS = 1_000_000
REQUEST_KERNELS = 4
BATCH_KERNELS = 16
QUARTER = 250  # milli-GPU


def _gpu() -> tuple[ctypes.CDLL, ctypes.c_void_p]:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, module, function = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuModuleLoadData(ctypes.byref(module), b"no device code\0") == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"infer") == 0
    return cuda, function


def _kernels(cuda: ctypes.CDLL, function: ctypes.c_void_p, count: int) -> None:
    for _ in range(count):
        rc = cuda.cuLaunchKernel(function, 256, 1, 1, 128, 1, 1, 0, None, None, None)
        if rc != 0 or cuda.cuCtxSynchronize() != 0:
            raise SystemExit(f"kernel launch failed: CUDA error {rc}")


def worker(kind: str, seconds: float, rate: float, seed: int) -> None:
    """One share's process: Poisson requests (latency from each one's arrival, one at a time
    as a replica's GPU is used), or batches back to back; prints its result as JSON."""
    cuda, function = _gpu()
    _kernels(cuda, function, 1)  # joined the arbiter, the context made
    start = time.monotonic()
    end = start + seconds
    if kind == "offline":
        batches = 0
        while time.monotonic() < end:
            _kernels(cuda, function, BATCH_KERNELS)
            batches += 1
        print(json.dumps({"batches_s": batches / (time.monotonic() - start)}))
        return
    rng = random.Random(seed)
    arrival, latencies = start + rng.expovariate(rate), []
    while arrival < end:
        wait = arrival - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        _kernels(cuda, function, REQUEST_KERNELS)
        latencies.append(time.monotonic() - arrival)
        arrival += rng.expovariate(rate)
    print(json.dumps({"latencies": latencies}))


class Node:
    """A simulated node of one GPU with its arbiter, and shares registered as the daemon does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        SimNode.open_or_create(parse_spec("1xA100-40GB"), root / "node").close()
        node = SimNode.open_or_create(None, root / "node")
        self.uuid = node.gpu(0).uuid
        node.close()
        self.arbiter_dir = root / "arbiter"
        prepare_dir(self.arbiter_dir)
        self.pid = start_arbiter(self.arbiter_dir, root / "arbiter.log")
        self.control = ArbiterControl(self.arbiter_dir)

    def start(self, priority: Priority, slice_us: int, *args: str | float) -> subprocess.Popen[str]:
        limits = ShareLimits((0,), None, QUARTER, priority=priority, slice_us=slice_us)
        share = ArbiterShare.new()
        self.control.register(limits.registration(share, os.getuid(), [self.uuid]))
        spec = build_launch_spec(
            [sys.executable, __file__, "--worker", *map(str, args)],
            limits,
            sim_node=self.root / "node",
            shared_region=new_shared_region(self.root),
            arbiter=(self.arbiter_dir, share),
        )
        env = {**spec.env, "GPUPOOL_SIM_KERNEL_NS": str(KERNEL_NS)}
        return subprocess.Popen(spec.argv, env=env, stdout=subprocess.PIPE, text=True)

    def close(self) -> None:
        self.control.close()
        os.kill(self.pid, 9)


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise SystemExit(f"a worker failed with exit code {process.returncode}")
    return dict(json.loads(out))


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1000


def run(node: Node, seconds: float, slice_us: int | None, seed: int) -> dict[str, list[float]]:
    """Each online service's latencies: alone (slice_us None) or pooled with that slice."""
    if slice_us is None:
        found = {}
        for i, (name, rate) in enumerate(ONLINE.items()):
            alone = node.start(Priority.HIGH, 0, "online", seconds, rate, seed + i)
            found[name] = list(_result(alone)["latencies"])
        return found
    offline = [node.start(Priority.LOW, 0, "offline", seconds + 1) for _ in OFFLINE]
    online = {
        name: node.start(Priority.HIGH, slice_us, "online", seconds, rate, seed + i)
        for i, (name, rate) in enumerate(ONLINE.items())
    }
    found = {name: list(_result(p)["latencies"]) for name, p in online.items()}
    for process in offline:
        _result(process)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slices", default="0,2000", help="online slices in us (0: 20 ms)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, seconds, *rest = args.worker
        worker(kind, float(seconds), float(rest[0]) if rest else 0.0, int(rest[1]) if rest else 0)
        return
    configs: list[int | None] = [None, *(int(s) for s in args.slices.split(","))]
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 cores)", flush=True)
    got: dict[int | None, dict[str, list[float]]] = {c: {n: [] for n in ONLINE} for c in configs}
    with tempfile.TemporaryDirectory(prefix="arbiter-slices-") as tmp:
        node = Node(Path(tmp))
        try:
            for round_ in range(args.rounds):
                for config in configs:
                    for name, values in run(node, args.seconds, config, 100 * round_).items():
                        got[config][name].extend(values)
        finally:
            node.close()
    print("online  config            p50 ms  p99 ms  p99 / alone")
    summary: dict[str, dict[str, float]] = {}
    for config in configs:
        label = "alone" if config is None else f"pooled, slice {config / 1000 or 20:g} ms"
        for name, values in got[config].items():
            p50, p99 = _percentile(values, 0.50), _percentile(values, 0.99)
            ratio = p99 / _percentile(got[None][name], 0.99)
            summary[f"{name} {label}"] = {"p50_ms": p50, "p99_ms": p99, "n": len(values)}
            print(f"{name:7} {label:17} {p50:7.1f} {p99:7.1f}  {ratio:5.2f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
