"""`gpupool ps --all` with 10,000 finished jobs: GET /v1/jobs?all=true in the daemon (target:
p99 <= 100 ms).

    python bench/ps_latency.py [--jobs 10000] [--calls 100]

In-process: an Agent on a simulated 2x A100-40GB node whose store holds `--jobs` finished jobs
(each with its own name, a five-word command, three environment variables and four events, as
`gpupool submit` makes them); then times the whole route through the ASGI app (the store's
read, each job's JSON, the response's encoding): its first call after the daemon's start, then
`--calls` more, in wall-clock and CPU milliseconds (the CPU time is the one to compare on a
busy machine), and prints a markdown table. Then, with `--prune`, gives each job a directory
with its two logs and times `gpupool prune --older-than 0s` in the agent (the rows, their
events, the directories).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import PRIORITY_RANK, JobSpec, State
from gpupool.api import server
from gpupool.api.app import create_app
from gpupool.devices.factory import open_backend

TARGET_P99_MS = 100.0


def fill(agent: Agent, count: int) -> None:
    """`count` finished jobs, written in one transaction (as many submissions would)."""
    now = time.time()
    jobs, events = [], []
    for n in range(count):
        spec = JobSpec(
            argv=("python", "train.py", "--epochs", str(n % 50), f"--out=/data/run{n}"),
            name=f"train-{n}",
            env={"HOME": "/home/alice", "LANG": "C.UTF-8", "SEED": str(n)},
            workdir="/home/alice/project",
            memory="4Gi",
            compute=250,
        )
        at = now - 3600 + n * 0.1
        state = State.SUCCEEDED if n % 7 else State.FAILED
        jobs.append(
            (
                n + 1,
                json.dumps(spec.to_json()),
                1000,
                "alice",
                state.value,
                PRIORITY_RANK[spec.priority],
                at,
                json.dumps([n % 2]),
                json.dumps([4 << 30]),
                at + 1,
                at + 60,
                0 if state is State.SUCCEEDED else 1,
            )
        )
        events += [
            (n + 1, at, "submitted", "by alice (uid 1000)"),
            (n + 1, at + 1, "placed", f"GPUs {n % 2}"),
            (n + 1, at + 1.1, "started", "pid 4242"),
            (n + 1, at + 60, state.value, "exit code 0"),
        ]
    with agent.store.transaction() as db:
        db.executemany(
            "INSERT INTO jobs (id, spec, uid, user, state, rank, submitted_at, gpus, memory, "
            "started_at, finished_at, exit_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            jobs,
        )
        db.executemany("INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)", events)


def timed(call: Callable[[], object], calls: int) -> tuple[np.ndarray, np.ndarray]:
    """Wall-clock and CPU (this process) milliseconds of each of `calls` calls."""
    wall, cpu = [], []
    for _ in range(calls):
        began, began_cpu = time.perf_counter(), time.process_time()
        call()
        wall.append((time.perf_counter() - began) * 1000)
        cpu.append((time.process_time() - began_cpu) * 1000)
    return np.array(wall), np.array(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--prune", action="store_true", help="Also time pruning them all.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "state").mkdir()
        with open_backend("2xA100-40GB", Path(tmp) / "node") as backend:
            agent = Agent(AgentConfig(Path(tmp) / "state"), backend)
            fill(agent, args.jobs)
            # the daemon answers only the Host names it knows (the test client's is testserver)
            client = TestClient(create_app(agent), base_url="http://localhost")
            server.settle()  # as `gpupool serve` does before it answers

            def route() -> bytes:
                response = client.get("/v1/jobs", params={"all": "true"})
                assert response.status_code == 200
                return bytes(response.content)

            rows = (
                ("first call", timed(route, 1)),
                ("next calls", timed(route, args.calls)),
            )
            assert len(json.loads(route())["jobs"]) == args.jobs
            pruned = timed_prune(agent, args.jobs) if args.prune else None
            agent.store.close()
    print(f"GET /v1/jobs?all=true, {args.jobs} finished jobs (target: p99 <= {TARGET_P99_MS:g} ms)")
    print()
    print("| calls | n | wall p50 ms | wall p99 ms | wall max ms | CPU p50 ms | CPU p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for what, (wall, cpu) in rows:
        p50, p99 = np.percentile(wall, [50, 99])
        c50, c99 = np.percentile(cpu, [50, 99])
        print(
            f"| {what} | {len(wall)} | {p50:.1f} | {p99:.1f} | {wall.max():.1f} | "
            f"{c50:.1f} | {c99:.1f} |"
        )
    if pruned is not None:
        print(f"\nprune of {args.jobs} finished jobs with their directories: {pruned:.0f} ms")


def timed_prune(agent: Agent, count: int) -> float:
    """Milliseconds to prune `count` finished jobs, each with a directory and two logs."""
    for job_id in range(1, count + 1):
        jobdir = agent.jobdir(job_id).path
        jobdir.mkdir()
        for log in ("stdout", "stderr"):
            (jobdir / log).write_text("a line of output\n")
    began = time.perf_counter()
    assert agent.prune(0) == count
    spent = (time.perf_counter() - began) * 1000
    assert not any(agent.jobs_dir.iterdir())
    return spent


if __name__ == "__main__":
    main()
