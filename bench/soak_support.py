"""What bench/soak.py drives and reads: the daemon's figures, the people who submit (real Unix
users who come and go when run as root), waves of trivial jobs submitted in parallel (the
daemon stores concurrent submits a batch per transaction), the services scaled and parked in a
thread of their own, and the compute caps measured on the simulated driver."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from daemon_support import percentile
from tests.agent.daemon_support import EXAMPLES, Daemon, until
from tests.users import User, add_to_group, create_user, remove_user, run_as

from gpupool.devices.sim.state import STATE_FILE, SimState
from gpupool.isolation.arbiter import read_shares, view_file
from gpupool.isolation.arbiter_control import node_arbiter_dir

REPO = Path(__file__).resolve().parents[1]
SHIM_CLIENT = REPO / "tests" / "native" / "progs" / "shim_client.c"
MODEL_SERVER = str(EXAMPLES / "model_server.py")
#: calls of the API in one sample of its p99
PROBES = 1000

#: run as a submitting user: COUNT submits of BODY (JSON) over THREADS connections at once
SUBMITTER = r"""
import json, sys
from concurrent.futures import ThreadPoolExecutor
from gpupool.api.client import Client
url, count, threads, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
def one(_):
    with Client(url) as client:
        return client.call("POST", "/v1/jobs", json=body)["job"]["id"]
with ThreadPoolExecutor(threads) as pool:
    print(" ".join(str(i) for i in pool.map(one, range(count))))
"""


@dataclass(frozen=True)
class Figures:
    """One sample of the daemon, after `jobs` jobs and `cycles` service cycles."""

    jobs: int
    cycles: int
    at_s: float  # since the daemon started
    rss_mib: float
    fds: int
    threads: int
    slots: tuple[int, ...]  # arbiter slots in use, per GPU
    store_kib: float  # state.db and its -wal
    job_dirs: int
    p99_ms: float


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {key} in /proc/{pid}/status: has the daemon exited?")


def gpu_uuids(daemon: Daemon) -> list[str]:
    state = SimState.open(daemon.node_dir / STATE_FILE)
    try:
        return [state.gpu(i).uuid for i in range(state.gpu_count)]
    finally:
        state.close()


def slots_in_use(daemon: Daemon, uuids: list[str]) -> tuple[int, ...]:
    directory = node_arbiter_dir(daemon.node_dir)
    return tuple(len(read_shares(view_file(directory, uuid))) for uuid in uuids)


def api_p99_ms(daemon: Daemon) -> float:
    """The 99th percentile of PROBES calls of GET /v1/jobs over the Unix socket, a connection
    each: over 1,000 calls the p99 is the tenth slowest, which one stall of the machine does not
    move as it moves the slowest of 100."""
    took = []
    for _ in range(PROBES):
        began = time.perf_counter()
        with daemon.client() as client:
            client.call("GET", "/v1/jobs")
        took.append((time.perf_counter() - began) * 1000)
    return percentile(took, 99)


def sample(daemon: Daemon, uuids: list[str], jobs: int, cycles: int, since: float) -> Figures:
    """The figures once the finished jobs are pruned (what the loop does after --keep-finished)."""
    daemon.call("POST", "/v1/prune", json={"older_than_s": 0})
    assert daemon.process is not None
    pid = daemon.process.pid
    state = daemon.state_dir
    store = sum(
        p.stat().st_size for p in (state / "state.db", state / "state.db-wal") if p.exists()
    )
    return Figures(
        jobs,
        cycles,
        time.monotonic() - since,
        _status(pid, "VmRSS") / 1024,
        len(os.listdir(f"/proc/{pid}/fd")),
        _status(pid, "Threads"),
        slots_in_use(daemon, uuids),
        store / 1024,
        sum(1 for _ in (state / "jobs").iterdir()),
        api_p99_ms(daemon),
    )


class People:
    """Who submits: `count` real users of the socket group (as root), the oldest replaced by a
    new one at each `turn()`; without root, this process's user alone."""

    def __init__(self, group: str | None, count: int) -> None:
        self.group = group
        self.users: list[User] = []
        self.made = 0
        for _ in range(count if group is not None else 0):
            self._add()

    def _add(self) -> None:
        user = create_user("gps")
        assert self.group is not None
        add_to_group(user, self.group)
        self.users.append(user)
        self.made += 1

    def turn(self) -> None:
        if self.users:
            remove_user(self.users.pop(0))
            self._add()

    def submit(self, daemon: Daemon, wave: int, count: int, threads: int) -> set[int]:
        """`count` jobs of `true` (5 % of a GPU, 1 GiB: arbitrated) by the wave's user."""
        body = '{"argv": ["true"], "workdir": "/", "memory": "1GiB", "compute": 5}'
        argv = [sys.executable, "-c", SUBMITTER, daemon.url, str(count), str(threads), body]
        if self.users:
            done = run_as(self.users[wave % len(self.users)], argv, timeout=600)
        else:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise SystemExit(f"a submitter failed: {done.stderr.strip()[-2000:]}")
        return {int(word) for word in done.stdout.split()}

    def close(self) -> None:
        for user in self.users:
            remove_user(user)
        self.users = []


def wait_ended(daemon: Daemon, ids: set[int], timeout: float = 600) -> None:
    """Until none of `ids` is queued or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = {job["id"] for job in daemon.call("GET", "/v1/jobs")["jobs"]}
        if not listed & ids:
            return
        time.sleep(0.2)
    raise SystemExit(f"jobs still queued or running after {timeout:g} s")


class Services:
    """`pairs` pairs of services behind the router, each pair cycled by a thread of its own:
    `scaled-N` goes from 1 replica to 2 and back; `parked-N` (MIN 0) is woken by a request and
    parks again (its replica suspended to host memory). A cycle is one of each; the pairs cycle
    at once, so that the daemon sees its services change as busy nodes do. `pause()` holds every
    thread between cycles, so that samples see one state."""

    def __init__(self, daemon: Daemon, router: str, limit: int, pairs: int) -> None:
        self.daemon, self.router, self.limit = daemon, router, limit
        self.cycles = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._go = threading.Event()
        self._stop = threading.Event()
        self._idle = [threading.Event() for _ in range(pairs)]
        for pair in range(pairs):
            self._create(f"scaled-{pair}", min_replicas=1, max_replicas=1)
            self._create(f"parked-{pair}", min_replicas=0, max_replicas=1, idle_s=1.0, window_s=0.5)
        for pair in range(pairs):
            self._wait(pair, lambda scaled, _parked: scaled["replicas"]["ready"] == 1, "ready")
        self._threads = [
            threading.Thread(target=self._run, args=(pair,), name=f"soak-pair-{pair}", daemon=True)
            for pair in range(pairs)
        ]

    def _create(self, name: str, **body: Any) -> None:
        sent = {
            "name": name,
            "argv": [sys.executable, MODEL_SERVER, "--memory-mib", "64"],
            "workdir": "/tmp",
            "memory": "1Gi",
            "compute": 20,
            "priority": "low",  # guarantees no compute: the caps' pair has a GPU of its own
            **body,
        }
        self.daemon.call("POST", "/v1/services", json=sent)

    def _service(self, name: str) -> dict[str, Any]:
        return self.daemon.call("GET", f"/v1/services/{name}")

    def _wait(self, pair: int, ok: Any, what: str, timeout: float = 120) -> None:
        def check() -> bool:
            return bool(ok(self._service(f"scaled-{pair}"), self._service(f"parked-{pair}")))

        if not until(check, timeout):
            raise RuntimeError(f"services of pair {pair}: not {what} within {timeout:g} s")

    def _scale(self, pair: int, count: int) -> None:
        body = {"min_replicas": count, "max_replicas": count}
        self.daemon.call("POST", f"/v1/services/scaled-{pair}/scale", json=body)

    def cycle(self, pair: int) -> None:
        """One scale cycle and one park cycle of a pair."""
        self._scale(pair, 2)
        self._wait(pair, lambda scaled, _parked: scaled["replicas"]["ready"] == 2, "scaled to 2")
        self._scale(pair, 1)
        self._wait(pair, lambda scaled, _parked: len(scaled["replica_list"]) == 1, "back to 1")
        answer = httpx.get(f"{self.router}/parked-{pair}/infer", timeout=120)
        if answer.status_code != 200:
            raise RuntimeError(f"parked-{pair} answered {answer.status_code}")
        self._wait(pair, lambda _scaled, parked: parked["replicas"]["suspended"] == 1, "parked")

    def _take(self) -> bool:
        """Count a cycle about to start; False once the limit is reached."""
        with self._lock:
            if self.cycles >= self.limit:
                return False
            self.cycles += 1
            return True

    def _run(self, pair: int) -> None:
        idle = self._idle[pair]
        try:
            while not self._stop.is_set():
                if not self._go.is_set():
                    idle.set()
                    self._go.wait()
                    idle.clear()
                    continue
                if not self._take():
                    return
                self.cycle(pair)
        except BaseException as err:  # told by the main thread
            self.error = err
        finally:
            idle.set()

    @property
    def finished(self) -> bool:
        return self.cycles >= self.limit and all(idle.is_set() for idle in self._idle)

    def start(self) -> None:
        self._go.set()
        for thread in self._threads:
            thread.start()

    def pause(self) -> None:
        self._go.clear()
        for idle in self._idle:
            idle.wait()
        if self.error is not None:
            raise SystemExit(f"the service cycles failed: {self.error}")

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(timeout=180)


def build_client(root: Path) -> Path:
    """The tests' driver API client (its `run SECONDS kernel` launches back to back)."""
    out = root / "shim_client"
    include = REPO / "native" / "include"
    command = ["gcc", "-O2", "-pthread", f"-I{include}", "-o", str(out), str(SHIM_CLIENT), "-ldl"]
    subprocess.run(command, check=True)
    out.chmod(0o755)
    return out


def _rate(daemon: Daemon, job_id: int) -> float:
    """Kernel launches per second of a finished `run` job."""
    job = daemon.wait(job_id, timeout=120)
    out = (daemon.state_dir / "jobs" / str(job_id) / "stdout").read_text().split()
    if job["state"] != "succeeded" or out[:1] != ["run"]:
        return 0.0  # killed (a compute escape) or failed: no share at all
    return int(out[1]) * 1e9 / int(out[2])


def caps(daemon: Daemon, client: Path, seconds: int = 6) -> tuple[float, float]:
    """The shares of the GPU that jobs capped at 30 % and 70 % get, both busy on one GPU (a
    whole-GPU `sleep` holds the other), against one job's rate alone: as the multi-user
    arbiter test measures them."""
    base = _rate(daemon, daemon.submit([str(client), "run", "2", "kernel"], memory="1GiB"))
    holder = daemon.submit(["sleep", str(seconds + 30)], memory="1GiB", compute=100)
    until(lambda: daemon.job(holder)["state"] == "running")
    argv = [str(client), "run", str(seconds), "kernel"]
    pair = [daemon.submit(argv, memory="1GiB", compute=c) for c in (30, 70)]
    gpus = [daemon.wait(j, ("running", "succeeded", "failed"))["gpus"] for j in pair]
    if gpus[0] != gpus[1]:
        raise SystemExit(f"the caps' pair is not on one GPU: {gpus}")
    low, high = (_rate(daemon, job_id) / base for job_id in pair)
    daemon.call("POST", f"/v1/jobs/{holder}/cancel", json={})
    daemon.wait(holder)
    return low, high
