"""The node daemon's targets: submit latency under 50 clients, submit to running, idle cost.

    python bench/daemon.py [--submits 1000] [--clients 50] [--floods 1] [--starts 100]

Prints a markdown table (docs/benchmarks/daemon.md records it with the machine's load).
1. `--submits` submits from `--clients` connected clients at once (threads, one connection
   each, over the Unix socket) while the node drains, so only the submit path is timed; then
   every job is checked to be stored exactly once; with the daemon's CPU time a submit. With a
   minimal HTTP client, which times the daemon (`--floods` times), then with httpx clients,
   which on a 2-core machine mostly time themselves.
2. Submit to running, one job at a time on an idle simulated node: until the daemon marks it
   running, and until the job's process exists (its start time from /proc).
3. The daemon idle for 10 s: CPU (share of one core) and RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_support import machine_load, percentile, start_daemon, url

from gpupool.api.client import Client

TICKS = os.sysconf("SC_CLK_TCK")


class LightClient:
    """A minimal HTTP/1.1 keep-alive client over the daemon's Unix socket. 50 httpx clients in
    one Python process need about as much CPU as the daemon itself, and on a 2-core machine they
    share it with the daemon, so with them the flood times the clients; with this one it times
    the daemon (a client process of its own, such as each `gpupool submit`, costs the daemon
    nothing)."""

    def __init__(self, socket_path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(socket_path))
        self.reader = self.sock.makefile("rb")

    def call(self, method: str, path: str, body: dict[str, object] | None = None) -> int:
        """The status of one request (the body is read and dropped)."""
        data = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: gpupool\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + data)
        status = int(self.reader.readline().split()[1])
        length = 0
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        self.reader.read(length)
        return status

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def submit_flood(
    root: Path, pid: int, submits: int, clients: int, light: bool, flood: int = 0
) -> list[str]:
    """`submits` from `clients` connected clients at once (connections made before the clock
    runs: the flood times submits, not 50 connections accepted at one instant), and the CPU
    time the daemon (`pid`) spent on each (steadier than the latency on a shared machine)."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = submits // clients
    kind = f"light{flood}-" if light else f"httpx{flood}-"  # each flood's jobs named apart
    ready = threading.Barrier(clients + 1)

    def submit_all(n: int, call: Callable[[dict[str, object]], None]) -> None:
        ready.wait()
        for i in range(per_client):
            body = {"argv": ["true"], "compute": 10, "name": f"{kind}{n}-{i}", "workdir": "/tmp"}
            started = time.perf_counter()
            call(body)
            with lock:
                latencies.append(time.perf_counter() - started)

    def client_thread(n: int) -> None:
        if light:
            raw = LightClient(root / "state" / "gpupool.sock")
            raw.call("GET", "/v1/health")

            def submit_light(body: dict[str, object]) -> None:
                if raw.call("POST", "/v1/jobs", body) != 201:
                    raise SystemExit("a submit was refused")

            submit_all(n, submit_light)
            raw.close()
            return
        with Client(url(root)) as client:
            client.call("GET", "/v1/health")
            submit_all(n, lambda body: client.call("POST", "/v1/jobs", json=body) and None)

    with Client(url(root)) as client:
        client.call("POST", "/v1/drain", json={"on": True})
    threads = [threading.Thread(target=client_thread, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    began, cpu = time.perf_counter(), _cpu_seconds(pid)
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    cpu_ms = (_cpu_seconds(pid) - cpu) * 1000 / submits
    with Client(url(root)) as client:
        jobs = client.call("GET", "/v1/jobs", params={"all": True})["jobs"]
        for job in jobs:
            if job["state"] in ("queued", "running"):
                client.call("POST", f"/v1/jobs/{job['id']}/cancel", json={})
        client.call("POST", "/v1/drain", json={"on": False})
    names = [job["name"] for job in jobs if job["name"].startswith(kind)]
    expected = {f"{kind}{n}-{i}" for n in range(clients) for i in range(per_client)}
    once = len(names) == len(expected) and set(names) == expected
    ms = [x * 1000 for x in latencies]
    who = "a minimal HTTP client" if light else "httpx, threads of one process"
    return [
        f"| submits from {clients} connected clients ({who}) | {len(ms)} in {wall:.1f} s "
        f"({len(ms) / wall:.0f}/s) | p50 {percentile(ms, 50):.1f} ms, "
        f"p99 {percentile(ms, 99):.1f} ms, max {max(ms):.1f} ms; daemon CPU {cpu_ms:.2f} ms a "
        "submit | p99 <= 50 ms |",
        f"| each stored exactly once | {'yes' if once else 'NO'} ({len(names)} stored) | | yes |",
    ]


def submit_to_running(root: Path, starts: int) -> list[str]:
    marked, spawned = [], []
    with Client(url(root)) as client:
        for _ in range(starts):
            body = {"argv": ["sleep", "0.2"], "compute": 10, "memory": "1GiB", "workdir": "/tmp"}
            sent, since_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
            job = client.call("POST", "/v1/jobs", json=body)["job"]
            while True:
                now = client.call("GET", f"/v1/jobs/{job['id']}")
                if now["started_at"] is not None:
                    break
                time.sleep(0.002)
            marked.append((now["started_at"] - sent) * 1000)
            pids = root / "state" / "jobs" / str(job["id"]) / "pids.json"
            while not pids.exists():
                time.sleep(0.002)
            start_ticks = json.loads(pids.read_text())["job_start"]
            spawned.append((start_ticks / TICKS - since_boot) * 1000)
            while client.call("GET", f"/v1/jobs/{job['id']}")["state"] == "running":
                time.sleep(0.02)
    return [
        f"| submit to running (daemon marks it) | {starts} jobs | p50 "
        f"{percentile(marked, 50):.1f} ms, p99 {percentile(marked, 99):.1f} ms | p99 <= 200 ms |",
        f"| submit to the job's process started | {starts} jobs | p50 "
        f"{percentile(spawned, 50):.0f} ms, p99 {percentile(spawned, 99):.0f} ms "
        f"(/proc start time, 1/{TICKS} s steps) | |",
    ]


def _cpu_seconds(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle(pid: int, seconds: float = 10.0) -> list[str]:
    time.sleep(2)
    before, began = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    share = (_cpu_seconds(pid) - before) / (time.monotonic() - began) * 100
    return [
        f"| idle daemon, {seconds:.0f} s | CPU {share:.2f} % of a core | RSS "
        f"{_rss_mib(pid):.0f} MiB | <= 1 %, <= 150 MiB |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument(
        "--floods", type=int, default=1, help="floods of the minimal client, one after another"
    )
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument("--spec", default="8xH100-80GB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        root = Path(tmp)
        daemon = start_daemon(root, args.spec)
        try:
            rows = []
            for k in range(args.floods):
                rows += submit_flood(
                    root, daemon.pid, args.submits, args.clients, light=True, flood=k
                )
            rows += submit_flood(root, daemon.pid, args.submits, args.clients, light=False)
            rows += submit_to_running(root, args.starts)
            rows += idle(daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait()
    print(f"gpupool daemon on a simulated {args.spec}; {machine_load()}\n")
    print("| what | measured | result | target |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
