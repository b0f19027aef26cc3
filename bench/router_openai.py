"""The router's cost for a request to its OpenAI API against the same request by /NAME.

One replica of examples/openai_server.py (no model, an answer at once) behind the router; the
same chat completion, a POST with a small JSON body, is sent to it directly, through the router
by its `/NAME/v1/chat/completions` path, and through the router's `/v1/chat/completions`
(routed by the body's `model`, which the router parses). The load generator is
examples/loadgen.py's: Poisson arrivals at RATE requests/s (latency), then 32 back-to-back
clients (throughput), for each path twice (A B C C B A; the run of lower p50 kept). Usage:

    python bench/router_openai.py [--seconds S] [--rate R]

It starts `gpupool serve --simulate 1xA100-40GB --router` for the replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
from inference_support import Pool  # noqa: E402

BODY = json.dumps(
    {"model": "bench-model", "messages": [{"role": "user", "content": "Say hello."}]}
).encode()


class Post(loadgen.Target):
    """loadgen's target, sending the chat completion as a POST."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        path = self.request.split(b" ", 2)[1]
        self.request = (
            b"POST " + path + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
        )


def measure(url: str, rate: float, seconds: float) -> dict[str, object]:
    paced = asyncio.run(loadgen.open_loop([Post(url)], rate, seconds)).summary()
    flat_out = asyncio.run(loadgen.closed_loop(Post(url), 32, seconds)).summary()
    if set(paced["statuses"]) != {"200"}:  # type: ignore[arg-type]
        raise SystemExit(f"{url}: {paced['statuses']}")
    return {"p50_ms": paced["p50_ms"], "p99_ms": paced["p99_ms"], "max_rps": flat_out["rate"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=500.0)
    args = parser.parse_args()
    server = [sys.executable, str(ROOT / "examples" / "openai_server.py"), "bench"]
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "1xA100-40GB") as pool,
    ):
        pool.create("bench", argv=server, models=["bench-model"], concurrency=1024)
        replica = pool.ready_ports("bench")[0]
        urls = {
            "direct (no proxy)": f"http://127.0.0.1:{replica}/v1/chat/completions",
            "router /NAME/v1/...": f"{pool.router}/bench/v1/chat/completions",
            "router /v1/... (model)": f"{pool.router}/v1/chat/completions",
        }
        # each path twice, in the order A B C C B A, the better run kept: what the machine's
        # other load does to one run is not taken for a path's cost
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in urls}
        for name in [*urls, *reversed(urls)]:
            runs[name].append(measure(urls[name], args.rate, args.seconds))
        rows = {name: min(found, key=lambda r: float(r["p50_ms"])) for name, found in runs.items()}  # type: ignore[arg-type]
    direct = rows["direct (no proxy)"]
    print(f"{'path':<24} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} {'+p99':>7} {'max req/s':>10}")
    for name, row in rows.items():
        extra50 = float(row["p50_ms"]) - float(direct["p50_ms"])  # type: ignore[arg-type]
        extra99 = float(row["p99_ms"]) - float(direct["p99_ms"])  # type: ignore[arg-type]
        print(
            f"{name:<24} {row['p50_ms']:>8} {row['p99_ms']:>8} {extra50:>7.2f} {extra99:>7.2f} "
            f"{row['max_rps']:>10}"
        )
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
