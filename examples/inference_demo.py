"""Inference pooling, as a user sees it (`make demo`): 8 model services on a simulated node of 2
GPUs behind the router, with traffic from a load generator.

Four online services take Poisson traffic at different rates (one busy enough to scale out),
two offline ones score batches back to back at low priority, one stays idle with MIN 0 and goes
to zero replicas, then is woken by a request that the router holds while a replica starts. At
the end: the GPUs the pool used against one GPU per service, and each service's p50/p99.
Usage: examples/inference_demo.py [BIN_DIR]   (BIN_DIR holds gpupool and python; default .venv/bin)
"""

from __future__ import annotations

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
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
from demo_support import bold, cli, free_port, simulated_daemon, until  # noqa: E402

SECONDS = 20.0
#: name -> (replicas, priority, concurrency, requests/s or None for batch scoring)
SERVICES: dict[str, tuple[str, str, int, float | None]] = {
    "chat": ("1..3", "high", 2, 60.0),
    "search": ("1..2", "high", 4, 15.0),
    "embed": ("1..2", "high", 4, 25.0),
    "rank": ("1..2", "high", 4, 5.0),
    "score": ("1..1", "low", 2, None),
    "label": ("1..1", "low", 2, None),
    "translate": ("1..2", "high", 4, 2.0),
    "summarize": ("0..1", "high", 4, 0.0),  # idle: to zero, then woken
}


def main() -> None:
    bin_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin").resolve()
    gpupool, python = str(bin_dir / "gpupool"), str(bin_dir / "python")
    work = Path(tempfile.mkdtemp(prefix="gpupool-inference-"))
    port = free_port()
    router = f"http://127.0.0.1:{port}"
    env = dict(os.environ, GPUPOOL_URL=f"unix://{work / 'state' / 'gpupool.sock'}")

    run = cli(gpupool, env)

    bold("== Inference pooling: 8 model services on a simulated node of 2x A100-40GB ==")
    with simulated_daemon(gpupool, "2xA100-40GB", work, port, env):
        bold("Each service: a model server (a share of 1/4 GPU: 8Gi, 25 %), replicas MIN..MAX")
        for name, (replicas, priority, concurrency, _rate) in SERVICES.items():
            run(
                "service", "create", name, "--replicas", replicas, "--memory", "8Gi",
                "--compute", "25", "--priority", priority, "--concurrency", str(concurrency),
                "--idle", "6s", "--window", "4s", "--workdir", "/tmp", "--",
                python, str(HERE / "model_server.py"), "--memory-mib", "2048",
            )  # fmt: skip
        until(lambda: all(s["replicas"]["ready"] for s in _services(run)), 30)
        bold(f"Traffic for {SECONDS:g} s through the router ({router}/NAME/...)")
        results = asyncio.run(_traffic(router))
        bold("Under load: chat scaled out; summarize went to zero replicas")
        run("service", "ls")
        bold("A request to summarize wakes it: the router holds it while a replica starts")
        began = time.perf_counter()
        woke = loadgen.Result()
        asyncio.run(loadgen.Target(f"{router}/summarize/infer").once(woke, began))
        print(f"  answered {dict(woke.statuses)} in {time.perf_counter() - began:.2f} s")
        _report(_services(run), results)


async def _traffic(router: str) -> dict[str, loadgen.Result]:
    async def batch(name: str) -> loadgen.Result:
        url = f"{router}/{name}/infer?kernels=16"
        return await loadgen.closed_loop(loadgen.Target(url), 2, SECONDS)

    names, runs = [], []
    for i, (name, (_r, _p, _c, rate)) in enumerate(SERVICES.items()):
        if rate == 0.0:
            continue
        names.append(name)
        if rate is None:
            runs.append(batch(name))
        else:
            target = loadgen.Target(f"{router}/{name}/infer")
            runs.append(loadgen.open_loop([target], rate, SECONDS, seed=i))
    return dict(zip(names, await asyncio.gather(*runs), strict=True))


def _services(run: Callable[..., str]) -> list[dict[str, Any]]:
    return list(json.loads(run("service", "ls", "--json", show=False))["services"])


def _report(services: list[dict[str, Any]], results: dict[str, loadgen.Result]) -> None:
    gpus = sorted({g for s in services for g in s["gpus"]})
    bold(f"GPUs used: {len(gpus)} pooled, against {len(SERVICES)} with one GPU per service")
    print(f"  {'service':<10} {'priority':<8} {'req/s':>6} {'p50 ms':>8} {'p99 ms':>8}  answers")
    for name, (_r, priority, _c, _rate) in SERVICES.items():
        result = results.get(name)
        if result is None:
            print(f"  {name:<10} {priority:<8} {'-':>6} {'-':>8} {'-':>8}  idle, woken once")
            continue
        row = result.summary()
        print(
            f"  {name:<10} {priority:<8} {row['rate']:>6.1f} {row['p50_ms']:>8.1f} "
            f"{row['p99_ms']:>8.1f}  {row['statuses']}"
        )


if __name__ == "__main__":
    main()
