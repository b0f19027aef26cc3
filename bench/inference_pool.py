"""Inference pooling on a simulated node: GPUs saved, latency kept, the router's cost, wake from
zero, and no request lost while replicas come and go (docs/benchmarks/inference.md).

1. Pooling: 8 services of the example model server (a 1/4-GPU share each: 8Gi, 25 %), 4 online
   (`high`, Poisson traffic at mixed rates, kernels that fill a few SMs) and 4 offline (`low`,
   batch scoring back to back, kernels that fill the GPU), on a node of 2 GPUs, in one sharing
   mode (`--mode`: mps, the default, or shim), against one GPU per service. Each online
   service's p99 pooled is compared with its p99 alone (the same service, traffic, share and
   mode on a node of its own); with `--dedicated`, also with its p99 when the 8 services and
   their traffic run at once with a whole GPU each (a node of 8 GPUs: the deployment pooling
   saves).
2. The router's overhead: /ping (no GPU work) at 500 requests/s through the router and straight
   to the replica; the most requests/s through the router from 32 clients back to back.
3. Wake from zero: a replica's own start (scaled 0 -> 1 by hand), then the latency of the first
   request to a service that went to zero replicas (the router holds it): from its replica
   parked in host memory (resumed), and cold (the parked replica cancelled: a new one starts).
4. No request lost: traffic through scale-out, a rolling update, a replica killed with -9, and
   scale-in; every request is answered (the crashed replica's in-flight ones with 502).

Usage: python bench/inference_pool.py [--seconds S] [--wakes N] [--only PART...] [--dedicated]
                                      [--mode mps|shim]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
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

LOADGEN = str(HERE.parent / "examples" / "loadgen.py")
#: online services: name -> requests/s (Poisson)
ONLINE = {"chat": 12.0, "search": 8.0, "embed": 20.0, "rank": 4.0}
#: an online request: 8 kernels of 16 blocks of 1024 threads, each 0.5 ms on 16 of an A100's 108
#: SMs (a batch-1 model's kernels fill few SMs): 4 ms of GPU time, as 4 kernels filling the GPU
ONLINE_SERVER = ("--blocks", "16", "--threads", "1024", "--kernels", "8")
#: offline services: back-to-back batch scoring, 2 clients each, 16 kernels of 1 ms a request,
#: each filling the GPU (the model server's default grid)
OFFLINE = ("score-a", "score-b", "score-c", "score-d")


def _online_load(pool: Pool, names: list[str], seconds: float) -> dict[str, loadgen.Result]:
    async def run() -> list[loadgen.Result]:
        return await asyncio.gather(
            *(
                loadgen.open_loop(
                    [loadgen.Target(f"{pool.router}/{name}/infer")], ONLINE[name], seconds, seed=i
                )
                for i, name in enumerate(names)
            )
        )

    return dict(zip(names, asyncio.run(run()), strict=True))


def _offline_load(pool: Pool, seconds: float) -> list[subprocess.Popen[str]]:
    """Batch scoring, each offline service from a load generator process of its own (in this
    process its loops would hold the online ones' GIL, a delay of the client's, not the pool's)."""
    return [
        subprocess.Popen(
            [
                *(sys.executable, LOADGEN, f"{pool.router}/{name}/infer?kernels=16"),
                *("--closed", "2", "--seconds", str(seconds)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in OFFLINE
    ]


def _rate(process: subprocess.Popen[str]) -> float:
    out, _ = process.communicate(timeout=600)
    result = json.loads(out.rpartition("RESULT ")[2])
    return (
        float(result["statuses"].get("200", 0))
        / max(1e-9, float(result["sent"]))
        * float(result["rate"])
    )


#: one GPU per service, as a deployment without pooling has it: the whole of an A100-40GB
WHOLE_GPU = {"compute": 100, "memory": "39Gi"}


def _all_services(
    spec: str, seconds: float, share: dict[str, Any]
) -> tuple[dict[str, loadgen.Result], dict[str, float], dict[str, list[int]]]:
    """The 8 services on a node of `spec`, each replica with `share` (its mode too: every
    service in one mode), under their traffic at once: each online service's latencies, each
    offline one's requests/s, where each went."""
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), spec) as pool,
    ):
        for name in ONLINE:
            pool.create(name, *ONLINE_SERVER, priority="high", concurrency=8, **share)
        for name in OFFLINE:
            pool.create(name, priority="low", concurrency=2, **share)
        for name in [*ONLINE, *OFFLINE]:
            pool.wait_ready(name)
        batch = _offline_load(pool, seconds)
        online = _online_load(pool, list(ONLINE), seconds)
        offline = {name: _rate(process) for name, process in zip(OFFLINE, batch, strict=True)}
        services = pool.call("GET", "/v1/services")["services"]
        return online, offline, {s["name"]: s["gpus"] for s in services}


def pooling(seconds: float, mode: str, dedicated: bool = False) -> dict[str, Any]:
    online, offline, placed = _all_services("2xA100-40GB", seconds, {"mode": mode})
    alone = {}
    for name in ONLINE:
        with (
            tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
            Pool(Path(tmp), "1xA100-40GB") as pool,
        ):
            pool.create(name, *ONLINE_SERVER, priority="high", concurrency=8, mode=mode)
            pool.wait_ready(name)
            alone[name] = _online_load(pool, [name], seconds)[name]
    result: dict[str, Any] = {
        "mode": mode,
        "gpus_pooled": len({g for gpus in placed.values() for g in gpus}),
        "gpus_dedicated": len(ONLINE) + len(OFFLINE),
        "placement": placed,
        "online": {
            name: {
                "rate": ONLINE[name],
                "pooled_p50_ms": online[name].summary()["p50_ms"],
                "pooled_p99_ms": online[name].summary()["p99_ms"],
                "alone_p50_ms": alone[name].summary()["p50_ms"],
                "alone_p99_ms": alone[name].summary()["p99_ms"],
                "statuses": online[name].summary()["statuses"],
            }
            for name in ONLINE
        },
        "offline_rps": {name: round(rate, 1) for name, rate in offline.items()},
    }
    if dedicated:  # the same services and traffic at once, one whole GPU each
        apart, apart_offline, _ = _all_services("8xA100-40GB", seconds, WHOLE_GPU | {"mode": mode})
        for name, row in result["online"].items():
            row["dedicated_p50_ms"] = apart[name].summary()["p50_ms"]
            row["dedicated_p99_ms"] = apart[name].summary()["p99_ms"]
        result["offline_rps_dedicated"] = {n: round(r, 1) for n, r in apart_offline.items()}
    return result


def router_overhead(seconds: float, rounds: int = 3) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "1xA100-40GB") as pool,
    ):
        pool.create("ping", concurrency=1024)
        port = pool.ready_ports("ping")[0]
        runs = []
        for _ in range(rounds):
            row = {}
            for how, url in (
                ("direct", f"http://127.0.0.1:{port}/ping"),
                ("router", f"{pool.router}/ping/ping"),
            ):
                result = asyncio.run(loadgen.open_loop([loadgen.Target(url)], 500, seconds))
                row[how] = result.summary()
            runs.append(row)
        target = loadgen.Target(f"{pool.router}/ping/ping")
        most = asyncio.run(loadgen.closed_loop(target, 32, seconds)).summary()
    return {"runs": runs, "max_rps": most["rate"], "max_statuses": most["statuses"]}


def wake(wakes: int) -> dict[str, Any]:
    """Each round: a wake from a replica parked in host memory (suspended, then resumed: the
    same job), then a cold wake (the parked replica cancelled first, so a new one starts, as
    without parking), and a replica's own start (scaled 0 -> 1 by hand, nothing parked)."""
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "1xA100-40GB") as pool,
    ):
        pool.create("cold", min_replicas=0, max_replicas=1, idle_s=1.0, window_s=0.5)
        pool.wait_ready("cold")
        starts, cold, warm = [], [], []
        for _ in range(wakes):
            parked = _until_parked(pool, "cold")
            warm.append(_first_request(pool, "cold"))
            assert [r["job_id"] for r in pool.service("cold")["replica_list"]] == [parked]
            _until_gone(pool, "cold", _until_parked(pool, "cold"))
            pool.call(
                "POST", "/v1/services/cold/scale", json={"min_replicas": 1, "max_replicas": 1}
            )
            began = time.perf_counter()
            pool.wait_ready("cold")
            starts.append(time.perf_counter() - began)
            pool.call(
                "POST", "/v1/services/cold/scale", json={"min_replicas": 0, "max_replicas": 1}
            )
            _until_gone(pool, "cold", _until_parked(pool, "cold"))
            cold.append(_first_request(pool, "cold"))
    return {
        "start": _p50_p99(starts),
        "cold_wake": _p50_p99(cold),
        "warm_wake": _p50_p99(warm),
        "memory_mib": 1024,
        "wakes": wakes,
    }


def _p50_p99(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return round(ordered[len(ordered) // 2], 3), round(ordered[-1], 3)


def _first_request(pool: Pool, name: str) -> float:
    """Seconds for one request to a service with no replica ready (the router holds it)."""
    began = time.perf_counter()
    result = loadgen.Result()
    asyncio.run(loadgen.Target(f"{pool.router}/{name}/infer").once(result, began))
    assert result.statuses == {"200": 1}, result.statuses
    return time.perf_counter() - began


def _until_parked(pool: Pool, name: str) -> int:
    """The job of the service's replica once it is suspended in host memory (scaled to zero)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        service = pool.service(name)
        if service["replicas"]["suspended"] == 1:
            return int(service["replica_list"][0]["job_id"])
        time.sleep(0.05)
    raise SystemExit(f"{name} did not park its replica: {json.dumps(pool.service(name))}")


def _until_gone(pool: Pool, name: str, job: int) -> None:
    """Cancel the parked `job`; back once the service has no replica left."""
    pool.call("POST", f"/v1/jobs/{job}/cancel", json={})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not pool.service(name)["replica_list"]:
            return
        time.sleep(0.05)
    raise SystemExit(f"{name} kept its replica")


def churn(seconds: float) -> dict[str, Any]:
    """Traffic while the service scales out, rolls, loses a replica and scales in."""
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "2xA100-40GB") as pool,
    ):
        pool.create("api", min_replicas=1, max_replicas=4, concurrency=4, window_s=3.0)
        pool.wait_ready("api")
        url = f"{pool.router}/api/infer?delay=0.05"
        steps: list[str] = []

        def events() -> None:
            time.sleep(seconds * 0.25)
            service = pool.wait_ready("api", 2, timeout=seconds)
            steps.append(f"scaled out to {service['replicas']['ready']}")
            pool.call("POST", "/v1/services/api/update", json={"env": {"VERSION": "2"}})
            steps.append("rolling update")
            time.sleep(seconds * 0.3)
            port = pool.ready_ports("api")[0]
            pid = asyncio.run(_pid(port))
            os.kill(pid, signal.SIGKILL)
            steps.append(f"killed replica on port {port} (-9)")

        actor = threading.Thread(target=events)
        actor.start()
        result = asyncio.run(loadgen.open_loop([loadgen.Target(url)], 120, seconds))
        actor.join()
        deadline = time.monotonic() + 30  # the load is gone: scale-in drains the extras
        while pool.service("api")["replicas"]["ready"] > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        service = pool.service("api")
        steps.append(f"scaled in to {service['replicas']['ready']}")
        return {
            "sent": sum(result.statuses.values()),
            "client_statuses": dict(result.statuses),
            "router_statuses": service["statuses"],
            "generation": service["generation"],
            "restarts": service["restarts"],
            "steps": steps,
        }


async def _pid(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /infer?kernels=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    body = (await reader.read()).partition(b"\r\n\r\n")[2]
    writer.close()
    return int(json.loads(body)["pid"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="Each load phase.")
    parser.add_argument("--wakes", type=int, default=10)
    parser.add_argument(
        "--only", nargs="+", choices=("pooling", "router", "wake", "churn"), help="These parts."
    )
    parser.add_argument(
        "--dedicated",
        action="store_true",
        help="Pooling: also run the services and their traffic at once with a whole GPU each.",
    )
    parser.add_argument(
        "--mode", choices=("mps", "shim"), default="mps", help="Pooling: the services' mode."
    )
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 cores)", flush=True)
    parts = {
        "pooling": lambda: pooling(args.seconds, args.mode, args.dedicated),
        "router": lambda: router_overhead(min(args.seconds, 8.0)),
        "wake": lambda: wake(args.wakes),
        "churn": lambda: churn(max(args.seconds, 15.0)),
    }
    results: dict[str, Any] = {
        name: part() for name, part in parts.items() if not args.only or name in args.only
    }
    results["load_average_end"] = round(os.getloadavg()[0], 2)
    report(results)
    print("RESULT " + json.dumps(results), flush=True)


def report(results: dict[str, Any]) -> None:
    for part, show in (
        ("pooling", _pooling),
        ("router", _router),
        ("wake", _wake),
        ("churn", _churn),
    ):
        if part in results:
            show(results[part])


def _pooling(pooled: dict[str, Any]) -> None:
    share = pooled["gpus_pooled"] / pooled["gpus_dedicated"]
    print(
        f"\nGPUs: {pooled['gpus_pooled']} pooled against {pooled['gpus_dedicated']} "
        f"(one per service): {share:.0%}; mode {pooled['mode']}"
    )
    for gpu in sorted({g for on in pooled["placement"].values() for g in on}):
        names = [name for name, on in pooled["placement"].items() if gpu in on]
        print(f"GPU {gpu}: {', '.join(names)}")
    dedicated = "offline_rps_dedicated" in pooled
    columns = [("alone", "x"), ("dedicated", "x ded.")] if dedicated else [("alone", "x")]
    header = "".join(f" {base + ' p50/p99 ms':>21} {label:>6}" for base, label in columns)
    print(f"{'online':<8} {'req/s':>6} {'pooled p50/p99 ms':>18}{header}")
    for name, row in pooled["online"].items():
        cells = "".join(
            f" {row[f'{base}_p50_ms']:>10.1f}/{row[f'{base}_p99_ms']:<9.1f}"
            f" {row['pooled_p99_ms'] / row[f'{base}_p99_ms']:>6.2f}"
            for base, _ in columns
        )
        print(
            f"{name:<8} {row['rate']:>6g} {row['pooled_p50_ms']:>8.1f}/{row['pooled_p99_ms']:<9.1f}"
            f"{cells}"
        )
    print("offline (low) req/s pooled: " + json.dumps(pooled["offline_rps"]))
    if dedicated:
        whole = json.dumps(pooled["offline_rps_dedicated"])
        print(f"offline (low) req/s, a whole GPU each: {whole}")


def _router(router: dict[str, Any]) -> None:
    print(
        f"\n{'router overhead':<16} {'direct p50/p99':>16} {'router p50/p99':>16} "
        f"{'+p50':>6} {'+p99':>6}"
    )
    for row in router["runs"]:
        d, r = row["direct"], row["router"]
        print(
            f"{'500 req/s':<16} {d['p50_ms']:>7.2f}/{d['p99_ms']:<8.2f} {r['p50_ms']:>7.2f}/"
            f"{r['p99_ms']:<8.2f} {r['p50_ms'] - d['p50_ms']:>6.2f} "
            f"{r['p99_ms'] - d['p99_ms']:>6.2f}"
        )
    print(f"most through the router (32 clients): {router['max_rps']} req/s")


def _wake(w: dict[str, Any]) -> None:
    start, cold, warm = w["start"], w["cold_wake"], w["warm_wake"]
    print(
        f"\nreplica start p50/p99 {start[0]}/{start[1]} s; wake from zero p50/p99: cold (a new "
        f"replica) {cold[0]}/{cold[1]} s, from host memory (resumed) {warm[0]}/{warm[1]} s, "
        f"over {w['wakes']} wakes each ({w['memory_mib']} MiB of weights)"
    )


def _churn(c: dict[str, Any]) -> None:
    print(
        f"\nchurn: {c['sent']} requests, client saw {c['client_statuses']}, router counted "
        f"{c['router_statuses']}; {'; '.join(c['steps'])}"
    )


if __name__ == "__main__":
    main()
