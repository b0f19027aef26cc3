"""Requests lost through the router while the daemon is killed with -9 (or stopped) and restarted.

    python bench/router_failover.py [--rate 50] [--kills 5] [--signal KILL] [--down 2]

A service of two replicas of the example model server (its /infer) on a simulated node gets
Poisson arrivals at RATE requests/s through `gpupool serve --router` (examples/loadgen.py, kept-
alive connections, as clients do) for the whole run, while the daemon is killed with the signal
KILLS times, stays down DOWN seconds, and is started again on the same state dir and --router.
Every request that got no 2xx answer is lost: a replica could have served it (they run all
along). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import loadgen  # noqa: E402
from daemon_support import machine_load  # noqa: E402
from inference_support import Pool  # noqa: E402

#: seconds of load before the first kill and after the last restart
SETTLE_S = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--signal", default="KILL", choices=["KILL", "TERM"])
    parser.add_argument("--down", type=float, default=2.0, help="seconds with no daemon")
    args = parser.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    with (
        tempfile.TemporaryDirectory(prefix="gpupool-failover-", ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), "2xA100-40GB") as pool,
    ):
        pool.create("steady", min_replicas=2, max_replicas=2, concurrency=16, memory="4Gi")
        pool.wait_ready("steady", 2)
        restarts: list[float] = []
        cycle = args.down + 3.0  # down, then up a while before the next kill
        seconds = 2 * SETTLE_S + args.kills * cycle
        results: list[loadgen.Result] = []
        target = loadgen.Target(f"{pool.router}/steady/infer")
        load = threading.Thread(
            target=lambda: results.append(
                asyncio.run(loadgen.open_loop([target], args.rate, seconds))
            )
        )
        load.start()
        time.sleep(SETTLE_S)
        for _ in range(args.kills):
            pool.process.send_signal(sig)
            pool.process.wait(30)
            time.sleep(args.down)
            began = time.monotonic()
            pool.start()
            restarts.append(time.monotonic() - began)
            time.sleep(cycle - args.down)
        load.join()
        summary = results[0].summary()
    statuses = dict(summary["statuses"])  # type: ignore[call-overload]
    sent = sum(statuses.values())
    lost = sent - sum(n for code, n in statuses.items() if code.startswith("2"))
    print(
        f"{args.kills} daemon stops by SIG{args.signal}, {args.down:g} s down each, at "
        f"{args.rate:g} requests/s; {machine_load()}\n"
    )
    print("| what | result |")
    print("|---|---|")
    print(f"| requests sent | {sent} |")
    print(f"| lost (no 2xx answer) | {lost} {statuses if lost else ''} |")
    print(
        f"| latency p50 / p99 / max ms | {summary['p50_ms']} / {summary['p99_ms']} / "
        f"{summary['max_ms']} |"
    )
    print(f"| daemon restart to API up, s (max) | {max(restarts):.2f} |")


if __name__ == "__main__":
    main()
