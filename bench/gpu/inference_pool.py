"""Model services pooled on one real GPU through the daemon: BERT-base and GPT-2 small replicas
(examples/torch_server.py: transformers models from their configs, random weights), each
service's p50/p99 alone on the GPU and pooled with the others (docs/benchmarks/inference.md).

Four services of a quarter GPU each (4Gi, 25 %): two BERT (/infer, 128 tokens) and two GPT-2
(/infer; and one 64-token stream through /generate, its first token's latency). Each takes
Poisson traffic at RATE requests/s through the router. Measured in each of `--modes` (default
both): `shim`, the GPU time-sliced between the replicas, and `mps`, their kernels side by side
on a quarter of the SMs each. It never changes the GPU's modes,
clocks or limits. `--simulate` runs the same steps on a simulated node with the simulated model
server (examples/model_server.py), so the script is never run blind on a GPU:

    make native && PYTHONPATH=src python bench/gpu/inference_pool.py --out inference-gpu.md
    PYTHONPATH=src python bench/gpu/inference_pool.py --simulate --seconds 3

`--swap` measures the swap instead (inference_swap.py): two GPT-2 services that do not fit the
GPU together, a request's first token when its model was parked in host memory against a cold
start and against a resident model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO / "examples"))

import loadgen  # noqa: E402
from inference_support import Pool  # noqa: E402
from inference_swap import measure_swap  # noqa: E402
from inference_swap import report as swap_report  # noqa: E402

SERVICES = {"bert-a": "bert", "bert-b": "bert", "gpt2-a": "gpt2", "gpt2-b": "gpt2"}


def argv(model: str, simulate: bool) -> list[str]:
    if simulate:
        return [sys.executable, str(REPO / "examples" / "model_server.py"), "--memory-mib", "512"]
    return [sys.executable, str(REPO / "examples" / "torch_server.py"), "--model", model]


def measure(pool: Pool, names: list[str], rate: float, seconds: float) -> dict[str, Any]:
    async def run() -> list[loadgen.Result]:
        return await asyncio.gather(
            *(
                loadgen.open_loop(
                    [loadgen.Target(f"{pool.router}/{name}/infer?tokens=128")], rate, seconds, i
                )
                for i, name in enumerate(names)
            )
        )

    return {n: r.summary() for n, r in zip(names, asyncio.run(run()), strict=True)}


def first_token(pool: Pool, name: str, simulate: bool) -> float:
    """Seconds from a /generate request to its first event."""
    path = "/stream?tokens=64" if simulate else "/generate?tokens=64"

    async def run() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", pool.port)
        began = time.perf_counter()
        writer.write(f"GET /{name}{path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await reader.readuntil(b"data: ")
        took = time.perf_counter() - began
        writer.close()
        return took

    return asyncio.run(run())


def run_mode(mode: str, spec: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """Each service alone on the GPU, then the four pooled on it, every replica in `mode`."""
    body = {
        "memory": "4Gi",
        "compute": 25,
        "mode": mode,
        "concurrency": 4,
        "ready_timeout_s": 600.0,
    }
    alone: dict[str, Any] = {}
    for name, model in SERVICES.items():
        with (
            tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
            Pool(Path(tmp), spec) as pool,
        ):
            pool.create(name, argv=argv(model, args.simulate), **body)
            pool.wait_ready(name, timeout=600)
            alone[name] = measure(pool, [name], args.rate, args.seconds)[name]
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), spec) as pool,
    ):
        for name, model in SERVICES.items():
            pool.create(name, argv=argv(model, args.simulate), **body)
        for name in SERVICES:
            pool.wait_ready(name, timeout=600)
        pooled = measure(pool, list(SERVICES), args.rate, args.seconds)
        token = first_token(pool, "gpt2-a", args.simulate)
        gpus = sorted({g for s in pool.call("GET", "/v1/services")["services"] for g in s["gpus"]})
    return {"alone": alone, "pooled": pooled, "first_token_s": token, "gpus": gpus}


def report(mode: str, result: dict[str, Any]) -> list[str]:
    lines = [
        f"## Mode {mode}",
        "",
        f"GPUs used pooled: {result['gpus']} (one per service: {len(SERVICES)})",
        f"GPT-2 stream, first token pooled: {result['first_token_s'] * 1000:.1f} ms",
        "",
        "| service | alone p50 / p99 ms | pooled p50 / p99 ms | p99 x | answers |",
        "|---|---|---|---|---|",
    ]
    for name in SERVICES:
        a, p = result["alone"][name], result["pooled"][name]
        ratio = p["p99_ms"] / a["p99_ms"] if a["p99_ms"] else float("nan")
        lines.append(
            f"| {name} | {a['p50_ms']} / {a['p99_ms']} | {p['p50_ms']} / {p['p99_ms']} | "
            f"{ratio:.2f} | {p['statuses']} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--simulate", action="store_true", help="A simulated node (dry run).")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=10.0, help="Requests/s per service.")
    parser.add_argument(
        "--modes", default="shim,mps", help="The sharing modes to measure, comma-separated."
    )
    parser.add_argument("--out", type=Path, help="Write the results as Markdown here.")
    parser.add_argument("--swap", action="store_true", help="Measure the swap instead.")
    args = parser.parse_args()
    if args.swap:
        spec = "1xA100-40GB" if args.simulate else None
        swapped = measure_swap(
            spec, argv("gpt2", args.simulate), lambda p, n: first_token(p, n, args.simulate)
        )
        write(args.out, "\n".join(swap_report(swapped)), {"swap": swapped})
        return
    modes = args.modes.split(",")
    if not set(modes) <= {"shim", "mps"}:
        parser.error(f"--modes: shim and mps are the modes a service runs in, not {args.modes}")
    spec = "1xA100-40GB" if args.simulate else None
    results = {mode: run_mode(mode, spec, args) for mode in modes}
    text = "\n".join(line for mode, result in results.items() for line in report(mode, result))
    write(args.out, text, results)


def write(out: Path | None, text: str, results: dict[str, Any]) -> None:
    print(text)
    print("RESULT " + json.dumps(results))
    if out:
        out.write_text(f"# Inference pooling on a GPU\n\n{text}")


if __name__ == "__main__":
    main()
