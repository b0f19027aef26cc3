"""More models than fit on a GPU: 16 services of 8 GiB on one simulated 80 GB GPU (it holds 9),
Zipf-distributed traffic (s = 1.0) at 50 requests/s, the idle models swapped to host memory and
back for their requests (agent/service_swap.py).

Each request is classed by where its model was when it arrived: resident (a replica ready) or
parked (it waited for a swap in). The targets (docs/benchmarks/inference.md): every request
answered; a resident model's p99 at most 1.5 x the same model alone on its own GPU (measured
here too, at the busiest model's rate); a swapped request's wait at most the copy of its 8 GiB at
the GPU's host link bandwidth plus 0.2 s; 1 GPU against 16 dedicated.

Usage: .venv/bin/python bench/model_swap.py [--seconds 120] [--models 16] [--rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import loadgen  # noqa: E402
from inference_support import Pool  # noqa: E402

from gpupool.devices.sim.spec import host_link  # noqa: E402

GPU = "A100-80GB"
MODEL_GIB = 8
#: a request's work: two kernels of a batch-1 decode step (0.5 ms each on 16 SMs)
SERVER = ("--memory-mib", str(MODEL_GIB * 1024), "--blocks", "16", "--threads", "1024")
SERVER += ("--kernels", "2")
#: each model's share: 8 GiB and a tenth of the GPU's compute (memory is what runs out)
SHARE = {"memory": f"{MODEL_GIB}Gi", "compute": 10, "min_replicas": 0, "max_replicas": 1}
SHARE |= {"idle_s": 3600.0, "window_s": 5.0}
#: the parked models' bytes are the simulated driver's accounting, not this host's memory
PARKED_MEMORY = "256Gi"


def zipf(count: int, s: float) -> list[float]:
    weights = [1.0 / (rank**s) for rank in range(1, count + 1)]
    return [w / sum(weights) for w in weights]


class Residency:
    """Which services have a ready replica, polled from the daemon every 50 ms."""

    def __init__(self, pool: Pool) -> None:
        self.pool, self.ready = pool, set[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            services = self.pool.call("GET", "/v1/services")["services"]
            self.ready = {s["name"] for s in services if s["replicas"]["ready"]}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def drive(
    pool: Pool, names: list[str], rate: float, seconds: float, where: Residency | None
) -> dict[str, loadgen.Result]:
    """Poisson arrivals at `rate`, each to a model drawn by Zipf, classed by where it was.
    Each model's clients come from an address of their own (127.0.0.2, .3, ...), as the apps
    of a shared inference endpoint do: the router bounds each peer's connections (128)."""
    targets = {
        name: loadgen.Target(f"{pool.router}/{name}/infer", source=f"127.0.0.{2 + i}")
        for i, name in enumerate(names)
    }
    weights = zipf(len(names), 1.0)
    results = {"resident": loadgen.Result(), "swapped": loadgen.Result()}
    rng, tasks = random.Random(7), set()
    start = at = time.perf_counter()
    while at - start < seconds:
        at += rng.expovariate(rate)
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        name = rng.choices(names, weights)[0]
        kind = "resident" if where is None or name in where.ready else "swapped"
        task = asyncio.create_task(targets[name].once(results[kind], at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks)
    for result in results.values():
        result.elapsed = time.perf_counter() - start
    return results


def settle(pool: Pool, names: list[str], timeout: float = 600) -> float:
    """Wait until every model has a replica, ready or parked, and nothing waits for room."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        services = [pool.service(name) for name in names]
        states = [r["state"] for s in services for r in s["replica_list"]]
        if len(states) == len(names) and set(states) <= {"ready", "suspended"}:
            return time.monotonic() - began
        time.sleep(0.5)
    raise SystemExit(f"the models did not settle in {timeout:g}s")


def pooled(models: int, rate: float, seconds: float) -> dict[str, Any]:
    names = [f"m{i:02d}" for i in range(models)]
    extra = ("--parked-memory", PARKED_MEMORY)
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), f"1x{GPU}", extra) as pool,
    ):
        for name in names:
            pool.create(name, *SERVER, **SHARE)
        settled = settle(pool, names)
        where = Residency(pool)
        try:
            results = asyncio.run(drive(pool, names, rate, seconds, where))
        finally:
            where.stop()
        services = [pool.service(name) for name in names]
        log = (pool.root / "serve.log").read_text()
        if os.environ.get("MODEL_SWAP_LOG"):  # the daemon's log kept, to read its swaps
            Path(os.environ["MODEL_SWAP_LOG"]).write_text(log)
    swaps_in = sum(s["swaps"]["in"] for s in services)
    swap_s = sum(s["swaps"]["in_seconds_sum"] for s in services)
    return {
        "models": models,
        "settle_s": round(settled, 1),
        "resident": results["resident"].summary(),
        "swapped": results["swapped"].summary(),
        "swaps_in": swaps_in,
        "swaps_out": sum(s["swaps"]["out"] for s in services),
        "swap_in_mean_s": round(swap_s / swaps_in, 3) if swaps_in else None,
        "cold_starts": sum(s["restarts"] for s in services),
        # a resume that found nothing to swap out gave way to a new replica (events kept: 50)
        "gave_way": sum("could not resume" in e["detail"] for s in services for e in s["events"]),
        "swapped_out_events": log.count(": swapped out for service"),
        "parked_for_swap": log.count("parking: swapped out"),
        # swapped out in the background, so that the next swap in finds room at once
        "kept_room": log.count(": swapped out to keep room for service"),
        # a victim that got a request of its own before it parked: it served on
        "taken_back": log.count("kept: a request came while it was parking"),
    }


def alone(rate: float, seconds: float) -> dict[str, Any]:
    """The busiest model alone on its own GPU, at its share of the traffic."""
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), f"1x{GPU}") as pool,
    ):
        pool.create("alone", *SERVER, **{**SHARE, "min_replicas": 1})
        pool.wait_ready("alone")
        results = asyncio.run(drive(pool, ["alone"], rate, seconds, None))
    return results["resident"].summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="The traffic's length.")
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--rate", type=float, default=50.0, help="Requests per second.")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    busiest = args.rate * zipf(args.models, 1.0)[0]
    swapping = pooled(args.models, args.rate, args.seconds)
    print("POOLED " + json.dumps(swapping), flush=True)
    results = {
        "pooled": swapping,
        "alone": alone(busiest, min(args.seconds, 60.0)),
        "copy_s": round(MODEL_GIB * 2**30 / host_link(GPU).bytes_per_s, 3),
        "load_average_end": round(os.getloadavg()[0], 2),
    }
    report(results, busiest)
    print("RESULT " + json.dumps(results), flush=True)


def report(results: dict[str, Any], busiest: float) -> None:
    pooled, alone = results["pooled"], results["alone"]
    resident, swapped = pooled["resident"], pooled["swapped"]
    print(f"settled in {pooled['settle_s']}s (9 resident, the rest parked)")
    print(
        f"resident: {resident['sent']} requests {resident['statuses']}, p50 "
        f"{resident['p50_ms']} ms, p99 {resident['p99_ms']} ms"
    )
    print(
        f"alone on its GPU at {busiest:.1f}/s: p50 {alone['p50_ms']} ms, p99 "
        f"{alone['p99_ms']} ms -> resident p99 x{resident['p99_ms'] / alone['p99_ms']:.2f} "
        "(target <= 1.5)"
    )
    target = results["copy_s"] + 0.2
    print(
        f"swapped: {swapped['sent']} requests {swapped['statuses']}, p50 {swapped['p50_ms']} "
        f"ms, p99 {swapped['p99_ms']} ms, max {swapped['max_ms']} ms (target <= "
        f"{target * 1000:.0f} ms: the copy {results['copy_s']}s + 0.2s)"
    )
    print(
        f"swaps: {pooled['swaps_out']} out, {pooled['swaps_in']} in (mean swap in "
        f"{pooled['swap_in_mean_s']}s), cold starts {pooled['cold_starts']}; 1 GPU against "
        f"{pooled['models']} dedicated"
    )


if __name__ == "__main__":
    main()
