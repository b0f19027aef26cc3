"""No request lost with the servers people run, at a high rate, through scale changes.

Four services behind the router, each on a server no one here wrote (tests/agent/
matrix_replica.py: http.server speaking HTTP/1.0, uvicorn, aiohttp, gunicorn's sync workers),
take Poisson arrivals at RATE requests/s in all (examples/loadgen.py's load generator, spread
over the four in turn) for SECONDS, while every service is scaled out from 1 to 3 replicas,
rolled to a new generation, and scaled back in to 1. The target: every answer a 200 (a 502
only from a replica that failed after taking its request, and none fails here). Usage:

    python bench/router_matrix.py [--seconds S] [--rate R]

It starts `gpupool serve --simulate 2xA100-40GB --router` for the replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
from inference_support import Pool  # noqa: E402

REPLICA = str(ROOT / "tests" / "agent" / "matrix_replica.py")
SERVERS = ("stdlib", "uvicorn", "aiohttp", "gunicorn")


def create(pool: Pool, server: str) -> str:
    name = f"m-{server}"
    pool.create(
        name,
        argv=[sys.executable, REPLICA, server],
        health="/health",
        memory="2Gi",
        compute=10,
        concurrency=8,
        min_replicas=1,
        max_replicas=1,
    )
    return name


def scale(pool: Pool, count: int) -> Callable[[str], Any]:
    bounds = {"min_replicas": count, "max_replicas": count}
    return lambda name: pool.call("POST", f"/v1/services/{name}/scale", json=bounds)


def update(pool: Pool) -> Callable[[str], Any]:
    return lambda name: pool.call("POST", f"/v1/services/{name}/update", json={"env": {"V": "2"}})


async def changes(pool: Pool, names: list[str], seconds: float) -> list[tuple[float, str]]:
    """Scale out, roll, scale in, at a fifth, two fifths and three fifths of the run."""
    steps = [(0.2, "scale out to 3", scale(pool, 3)), (0.4, "rolling update", update(pool))]
    steps.append((0.6, "scale in to 1", scale(pool, 1)))
    began, done = time.monotonic(), []
    for at, what, step in steps:
        await asyncio.sleep(max(0.0, began + at * seconds - time.monotonic()))
        for name in names:
            await asyncio.to_thread(step, name)
        done.append((round(time.monotonic() - began, 2), what))
    return done


async def run(pool: Pool, names: list[str], rate: float, seconds: float) -> dict[str, Any]:
    targets = [loadgen.Target(f"{pool.router}/{name}/infer") for name in names]
    load = loadgen.open_loop(targets, rate, seconds)
    result, done = await asyncio.gather(load, changes(pool, names, seconds))
    return {"load": result.summary(), "changes": done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=500.0)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "2xA100-40GB") as pool,
    ):
        names = [create(pool, server) for server in SERVERS]
        for name in names:
            pool.wait_ready(name)
        found = asyncio.run(run(pool, names, args.rate, args.seconds))
        time.sleep(0.5)  # the router's counters reach the daemon ten times a second
        found["counted"] = {name: pool.service(name)["statuses"] for name in names}
        found["replicas"] = {
            name: sorted({r["port"] for r in pool.service(name)["replica_list"]}) for name in names
        }
    found["load_average_end"] = os.getloadavg()[0]
    load = found["load"]
    print(f"{load['sent']} requests at {load['rate']} req/s: {load['statuses']}")
    print(f"p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms; changes at {found['changes']}")
    print("counted by the router:", found["counted"])
    print("RESULT", json.dumps(found))


if __name__ == "__main__":
    main()
