"""The /metrics route's work in one process, without HTTP or the daemon's other threads.

    python bench/metrics_body.py [--jobs 100] [--gpus 8] [--runs 300]

Makes `--jobs` running jobs on a simulated node of `--gpus` A100-40GB in a fresh store, each with
an initialised accounting region and a usage sample, as bench/metrics.py's jobs are once the
daemon sees them; then times, `--runs` times each: the route's body (the collector's families
written by api/exposition.py), the same families through prometheus_client's generate_latest
(what the route did before), and the store's read of the live jobs. Prints one line each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import JobSpec, State
from gpupool.agent.usage import Usage
from gpupool.api.exposition import render
from gpupool.api.metrics import AgentCollector
from gpupool.devices.factory import open_backend
from gpupool.isolation import region
from gpupool.isolation.launch import new_shared_region


def add_running_jobs(agent: Agent, jobs: int, gpus: int) -> None:
    header = region.HEADER.pack(region.MAGIC, region.VERSION, region.FILE_SIZE, 1)
    for n in range(jobs):
        spec = JobSpec(argv=(sys.executable, "-c", "pass"), compute=60, memory="1Gi")
        job = agent.store.start(agent.store.add(spec, 0, "root"), [n % gpus], [1 << 30], "placed")
        agent.jobdir(job.id).path.mkdir(parents=True)
        new_shared_region(agent.jobdir(job.id).path).write_bytes(
            header.ljust(region.FILE_SIZE, b"\0")
        )
        agent.observed.per_gpu[(job.id, n % gpus)] = Usage(64 << 20, 5)


def timed(work: Callable[[], object], runs: int) -> str:
    ms = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        ms.append((time.perf_counter() - started) * 1000)
    ms.sort()
    return f"p50 {ms[len(ms) // 2]:.2f} ms, min {ms[0]:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        root = Path(tmp)
        (root / "state").mkdir()
        with open_backend(f"{args.gpus}xA100-40GB", root / "node") as backend:
            agent = Agent(AgentConfig(root / "state"), backend)
            agent.observed.sampled(backend.snapshot(), {})
            add_running_jobs(agent, args.jobs, args.gpus)
            collector = AgentCollector(agent.view)
            registry = CollectorRegistry(auto_describe=False)
            registry.register(collector)
            body = render(collector.families())
            live = [State.QUEUED, State.RUNNING]
            work: dict[str, Callable[[], object]] = {
                "route body, render(families())": lambda: render(collector.families()),
                "generate_latest over collect()": lambda: generate_latest(registry),
                "store.jobs of the live jobs": lambda: agent.store.jobs(live),
            }
            print(f"{args.jobs} running jobs on {args.gpus} GPUs, {len(body)} bytes a scrape")
            for what, call in work.items():
                print(f"{what + ':':32} {timed(call, args.runs)}")
            agent.store.close()


if __name__ == "__main__":
    main()
