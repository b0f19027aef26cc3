"""Which proxy for the router: gpupool's asyncio-streams router against aiohttp and uvicorn+httpx.

Each candidate proxies one replica of the example model server (its /ping: no GPU work), run in
a process of its own; the same load generator (examples/loadgen.py) measures it: Poisson
arrivals at 500 requests/s (latency against calling the replica directly) and 32 back-to-back
clients (throughput). The two others stream as the router must (chunk by chunk). Usage:

    python bench/router_proxies.py [--seconds S]

Needs a simulated node for the replica: it starts `gpupool serve --simulate 1xA100-40GB --router`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))

import loadgen  # noqa: E402

AIOHTTP = """
import sys
from aiohttp import ClientSession, TCPConnector, web
upstream = f"http://127.0.0.1:{sys.argv[2]}"
async def start(app):
    app["session"] = ClientSession(connector=TCPConnector(limit=0), auto_decompress=False)
async def proxy(request):
    path = "/" + request.match_info["rest"]
    async with request.app["session"].request(request.method, upstream + path,
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
            data=request.content if request.can_read_body else None) as answer:
        out = web.StreamResponse(status=answer.status, headers={k: v for k, v in
            answer.headers.items() if k.lower() not in ("content-length", "transfer-encoding",
            "connection")})
        await out.prepare(request)
        async for piece in answer.content.iter_any():
            await out.write(piece)
        await out.write_eof()
        return out
app = web.Application()
app.on_startup.append(start)
app.router.add_route("*", "/{name}/{rest:.*}", proxy)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

UVICORN_HTTPX = """
import sys
import httpx, uvicorn
upstream = f"http://127.0.0.1:{sys.argv[2]}"
client = httpx.AsyncClient(base_url=upstream, timeout=60, limits=httpx.Limits(max_connections=None))
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = "/" + scope["path"].split("/", 2)[2]
    request = client.build_request(scope["method"], path, headers=[(k, v) for k, v in
        scope["headers"] if k != b"host"])
    answer = await client.send(request, stream=True)
    headers = [(k, v) for k, v in answer.headers.raw if k.lower() not in (b"connection",
        b"transfer-encoding")]
    await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
    async for piece in answer.aiter_raw():
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
    await answer.aclose()
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
            http="httptools", loop="asyncio")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def measure(url: str, seconds: float) -> dict[str, object]:
    target = loadgen.Target(url)
    paced = asyncio.run(loadgen.open_loop([target], 500, seconds)).summary()
    flat_out = asyncio.run(loadgen.closed_loop(loadgen.Target(url), 32, seconds)).summary()
    return {"p50_ms": paced["p50_ms"], "p99_ms": paced["p99_ms"], "max_rps": flat_out["rate"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from inference_support import Pool

    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "1xA100-40GB") as pool,
    ):
        pool.create("ping", concurrency=1024)
        replica = pool.ready_ports("ping")[0]
        rows = {"direct (no proxy)": measure(f"http://127.0.0.1:{replica}/ping", args.seconds)}
        rows["gpupool router"] = measure(f"{pool.router}/ping/ping", args.seconds)
        for name, code in (("aiohttp", AIOHTTP), ("uvicorn+httpx", UVICORN_HTTPX)):
            port = free_port()
            proxy = subprocess.Popen([sys.executable, "-c", code, str(port), str(replica)])
            try:
                wait_port(port)
                rows[name] = measure(f"http://127.0.0.1:{port}/ping/ping", args.seconds)
            finally:
                proxy.terminate()
                proxy.wait(10)
    direct = rows["direct (no proxy)"]
    print(f"{'proxy':<20} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} {'+p99':>7} {'max req/s':>10}")
    for name, row in rows.items():
        extra50 = float(row["p50_ms"]) - float(direct["p50_ms"])  # type: ignore[arg-type]
        extra99 = float(row["p99_ms"]) - float(direct["p99_ms"])  # type: ignore[arg-type]
        print(
            f"{name:<20} {row['p50_ms']:>8} {row['p99_ms']:>8} {extra50:>7.2f} {extra99:>7.2f} "
            f"{row['max_rps']:>10}"
        )
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
