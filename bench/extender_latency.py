"""The scheduler extender's answer time: filter + prioritize for one pod over 10,000 nodes.

The extender runs as it does in a cluster, an HTTP server (uvicorn, in its own process) with
a warm cache of every node's GPUs (8 per node, partly used at random); the client posts the
ExtenderArgs kube-scheduler sends with `nodeCacheCapable: true` (the pod and the node names),
then the same to /prioritize with the nodes that passed, and times both together; then, untimed,
it binds the pod to the best node as kube-scheduler does, so every pod meets a fleet changed
since the pod before. The first request's body is encoded before the clock starts
(kube-scheduler encodes it in Go, not our cost); the filter's answer is decoded and the second
body encoded inside the timing, the prioritize answer read whole inside it and decoded
(checked) after it, as Python's decoding of 10,000 objects costs more than the extender's whole
answer and is kube-scheduler's, in Go. The client is http.client on one kept-alive connection,
lean as kube-scheduler's.

`--asks N` takes N pod shapes in turn (default 1, the replicas of one workload, whose answers
the extender updates where a bind changed a node; more than 8 makes every answer anew).
`--mix trace` draws each pod's shape instead from the GPU pods of the Alibaba trace's `default`
workload, as often as they occur there (24 shapes: whole GPUs 1, 2, 4 or 8, and one-GPU shares
from 50 to 810 milli; GPU memory in proportion): a cluster's stream, where a rare shape comes
first now and then among the common ones.
`--low` annotates the pods `gpupool.io/priority: low` (opportunistic: answered over the
GPUs as such a pod sees them, every GPU's compute free; bound holding memory and no compute).
`--floor` times the same client against a server that answers canned bytes of the same size:
what no extender can save on this machine. Prints a markdown table.

    .venv/bin/python bench/extender_latency.py [--nodes 10000] [--pods 300] [--asks 1] [--low]
        [--floor]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import random
import socket
import statistics
import time
from typing import Any

import httpx

from gpupool.core.units import GiB
from gpupool.k8s import names
from gpupool.k8s.extender import Extender
from gpupool.k8s.fleet import Charge
from gpupool.k8s.inventory import GpuInfo, encode
from gpupool.k8s.kubeapi import InMemoryKube

GPUS_PER_NODE = 8
#: the GPU pods of the Alibaba trace's `default` workload: (GPUs, milli per GPU) -> pods
TRACE_SHAPES = {
    (1, 1000): 3911, (1, 810): 1078, (1, 470): 750, (1, 320): 328, (1, 650): 253,
    (1, 230): 140, (1, 460): 128, (1, 590): 75, (1, 160): 74, (1, 550): 72, (1, 220): 62,
    (1, 370): 47, (8, 1000): 44, (1, 110): 24, (1, 480): 19, (2, 1000): 16, (4, 1000): 15,
    (1, 50): 7, (1, 330): 7, (1, 350): 6, (1, 270): 4, (1, 440): 2, (1, 140): 1, (1, 290): 1,
}  # fmt: skip


def build(
    nodes: int, seed: int, pods: int, asks: int = 1, low: bool = False, mix: str = "asks"
) -> Extender:
    """An extender knowing `nodes` nodes of 8 GPUs, a third of each GPU's compute used at random."""
    rng = random.Random(seed)
    # kubelets that start each pod at once: a node takes the next pod of a size right away
    api = InMemoryKube(run_on_bind=True)
    for n in range(nodes):
        inventory = [
            GpuInfo(i, f"GPU-{n}-{i}", "A100-80GB", 80 * GiB) for i in range(GPUS_PER_NODE)
        ]
        api.add_node(f"node-{n:05d}", {names.ANN_NODE_GPUS: encode(inventory)})
    for i in range(pods):
        api.add_pod(pod(i, asks, low, mix))
    extender = Extender(api)
    extender.resync()
    for n in range(nodes):
        for gpu in range(GPUS_PER_NODE):
            milli = rng.choice([0, 0, 250, 500, 750, 1000])
            if milli:
                charge = Charge(f"node-{n:05d}", (gpu,), milli * 80 * GiB // 1000, milli, False)
                extender.fleet.charge(charge)
    return extender


def serve(port: int, nodes: int, seed: int, pods: int, asks: int, low: bool, mix: str) -> None:
    import uvicorn

    from gpupool.k8s.extender_http import create_app

    uvicorn.run(
        create_app(build(nodes, seed, pods, asks, low, mix)),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )


def serve_floor(port: int, node_names: list[str]) -> None:
    """The floor: an ASGI app under the same uvicorn that reads each body and answers canned
    bytes of the same size (every node fits, every score 5) without looking at them."""
    import uvicorn

    canned = {
        "/filter": json.dumps(
            {"nodenames": node_names, "failedNodes": {}, "failedAndUnresolvableNodes": {}}
        ).encode(),
        "/prioritize": json.dumps(
            [{"host": n, "score": 5} for n in node_names], separators=(",", ":")
        ).encode(),
        "/bind": b"{}",
        "/healthz": b"{}",
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        body = canned[scope["path"]]
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trace_shape(i: int) -> tuple[int, int]:
    """Pod i's (GPUs, milli per GPU) in `--mix trace`: drawn by the pod's number, so the server
    (which lists the pods) and the client draw the same."""
    shapes = list(TRACE_SHAPES)
    weights = list(TRACE_SHAPES.values())
    return random.Random(i).choices(shapes, weights)[0]


def pod(i: int, asks: int = 1, low: bool = False, mix: str = "asks") -> dict[str, Any]:
    """Pod i: 1 GPU, 10Gi and 30 %, or (asks > 1) one of `asks` different memory sizes, or a
    shape of the trace's (`mix` "trace"); `low` priority or the default (high)."""
    if mix == "trace":
        gpus, milli = trace_shape(i)
        limits = {
            names.RESOURCE_GPU: str(gpus),
            names.RESOURCE_MEMORY: f"{80 * 1024 * milli // 1000}Mi",
            names.RESOURCE_COMPUTE: str(milli // 10),
        }
    else:
        memory = "10Gi" if asks == 1 else f"{10 * 1024 + i % asks}Mi"
        limits = {
            names.RESOURCE_GPU: "1",
            names.RESOURCE_MEMORY: memory,
            names.RESOURCE_COMPUTE: "30",
        }
    annotations = {names.ANN_PRIORITY: "low"} if low else {}
    return {
        "metadata": {
            "name": f"bench-{i}",
            "namespace": "default",
            "uid": f"u{i}",
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def binding(i: int, node: str) -> dict[str, str]:
    return {"podName": f"bench-{i}", "podNamespace": "default", "podUID": f"u{i}", "node": node}


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"{path}: HTTP {response.status}: {data[:200]!r}")
    return data


def measure(
    port: int,
    node_names: list[str],
    pods: int,
    warmup: int,
    asks: int,
    low: bool,
    mix: str = "asks",
) -> list[float]:
    timings = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(warmup + pods):
        args = {"pod": pod(i, asks, low, mix), "nodenames": node_names}
        body = json.dumps(args).encode()
        start = time.perf_counter()
        fit = json.loads(post(conn, "/filter", body))["nodenames"]
        if not fit:  # unschedulable now (an 8-GPU pod of the trace's mix): kube-scheduler
            # asks no priorities and binds nothing; the filter's answer is the pod's time
            if i >= warmup:
                timings.append((time.perf_counter() - start) * 1000)
            continue
        answer = post(conn, "/prioritize", json.dumps({**args, "nodenames": fit}).encode())
        elapsed = time.perf_counter() - start
        scores = json.loads(answer)
        assert len(scores) == len(fit)
        best = max(scores, key=lambda s: s["score"])["host"]
        bound = post(conn, "/bind", json.dumps(binding(i, best)).encode())
        assert json.loads(bound) == {}, bound
        if i >= warmup:
            timings.append(elapsed * 1000)
    conn.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="node names per call (default: all); kube-scheduler sends about 5%% of a large "
        "cluster (percentageOfNodesToScore)",
    )
    parser.add_argument(
        "--asks",
        type=int,
        default=1,
        help="different pod shapes, taken in turn (default 1: replicas of one workload); more "
        "than the extender keeps answers for (8) makes every pod's answer anew",
    )
    parser.add_argument(
        "--mix",
        choices=("asks", "trace"),
        default="asks",
        help="pod shapes: --asks of them in turn, or drawn as often as in the Alibaba trace",
    )
    parser.add_argument(
        "--low", action="store_true", help="low-priority (opportunistic) pods, not high ones"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="time the HTTP server and this client alone: canned answers of the same size",
    )
    args = parser.parse_args()
    port = free_port()
    step = max(1, args.nodes // (args.candidates or args.nodes))
    node_names = [f"node-{n:05d}" for n in range(0, args.nodes, step)][: args.candidates]
    spawn = multiprocessing.get_context("spawn")
    if args.floor:
        server = spawn.Process(target=serve_floor, args=(port, node_names), daemon=True)
    else:
        server = spawn.Process(
            target=serve,
            args=(
                port,
                args.nodes,
                args.seed,
                args.warmup + args.pods,
                args.asks,
                args.low,
                args.mix,
            ),
            daemon=True,
        )
    server.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or not server.is_alive():
                raise SystemExit("the extender did not start") from None
            time.sleep(0.2)
    load = os.getloadavg()[0]
    timings = measure(port, node_names, args.pods, args.warmup, args.asks, args.low, args.mix)
    load_after = os.getloadavg()[0]
    server.terminate()
    q = statistics.quantiles(timings, n=100)
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load:.2f} at start, {load_after:.2f} at the end"
    )
    print()
    print(
        "| server | nodes | names per call | pod shapes | pods timed | p50 ms | p99 ms | max ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {'canned (floor)' if args.floor else 'extender'}{' (low pods)' if args.low else ''} "
        f"| {args.nodes:,} "
        f"| {len(node_names):,} | {'trace' if args.mix == 'trace' else args.asks} "
        f"| {len(timings)} | {q[49]:.2f} | {q[98]:.2f} "
        f"| {max(timings):.2f} |"
    )


if __name__ == "__main__":
    main()
