"""/metrics latency with 100 running jobs on a simulated node of 8 GPUs (target: p99 <= 50 ms),
and the web dashboard's data and live parts under the same load.

    python bench/metrics.py [--jobs 100] [--gpus 8] [--scrapes 300]

Starts `gpupool serve` on a simulated 8x A100-40GB node, runs `--jobs` jobs that each hold GPU
memory on the simulated driver and sleep (so the node's CPU goes to the daemon, not to them),
waits until the daemon's sampler sees every one of them on its GPU, then asks /metrics (and then
/v1/dashboard and /dashboard/parts) `--scrapes` times each, one after another, over the Unix
socket with a minimal HTTP client, and prints a markdown table
(docs/benchmarks/observability.md records it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon import LightClient
from daemon_support import machine_load, percentile, start_daemon, url

from gpupool.api.client import Client

#: holds 64 MiB on the simulated GPU, then sleeps: a job that is on its GPU but costs no CPU
HOLDER = (
    "import ctypes, time\n"
    "cuda = ctypes.CDLL('libcuda.so.1')\n"
    "ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()\n"
    "assert cuda.cuInit(0) == 0\n"
    "assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0\n"
    "assert cuda.cuCtxSetCurrent(ctx) == 0\n"
    "assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)) == 0\n"
    "time.sleep(3600)\n"
)


#: what is timed, and its target (None: none set)
PATHS = (("/metrics", 50.0), ("/v1/dashboard", None), ("/dashboard/parts", None))


def scrape_once(client: LightClient, path: str) -> float:
    started = time.perf_counter()
    if client.call("GET", path) != 200:
        raise SystemExit(f"{path} did not answer 200")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    per_gpu = -(-args.jobs // args.gpus)
    compute = max(1, 100 // per_gpu - 1)
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        root = Path(tmp)
        daemon = start_daemon(root, f"{args.gpus}xA100-40GB")
        try:
            with Client(url(root)) as client:
                for n in range(args.jobs):
                    body = {
                        "argv": [sys.executable, "-c", HOLDER],
                        "compute": compute,
                        "memory": "1Gi",
                        "name": f"holder-{n}",
                        "workdir": "/tmp",
                    }
                    client.call("POST", "/v1/jobs", json=body)
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    jobs = client.call("GET", "/v1/jobs")["jobs"]
                    seen = [j for j in jobs if j["state"] == "running" and j["live_memory"]]
                    if len(seen) == args.jobs:
                        break
                    time.sleep(1)
                else:
                    raise SystemExit(f"only {len(seen)} of {args.jobs} jobs seen on their GPUs")
            raw = LightClient(root / "state" / "gpupool.sock")
            timings = {}
            for path, _ in PATHS:
                for _ in range(10):  # warm up
                    scrape_once(raw, path)
                timings[path] = [scrape_once(raw, path) * 1000 for _ in range(args.scrapes)]
            raw.close()
            with Client(url(root)) as client:
                for job in client.call("GET", "/v1/jobs")["jobs"]:
                    client.call("POST", f"/v1/jobs/{job['id']}/cancel", json={})
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    print(f"{machine_load()}\n")
    print("| what | measured | target |")
    print("|---|---|---|")
    for path, target in PATHS:
        ms = timings[path]
        print(
            f"| {path}, {args.jobs} running jobs on {args.gpus} GPUs, {len(ms)} requests | "
            f"p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms, "
            f"max {max(ms):.1f} ms | {f'p99 <= {target:g} ms' if target else '-'} |"
        )


if __name__ == "__main__":
    main()
