"""How long each client command of `gpupool` takes, wall time, against a running daemon.

    python bench/cli_latency.py [--runs 21] [--finished 200] [--before OLD_CHECKOUT]

Starts `gpupool serve` on a simulated node (2xA100-40GB), fills it with `--finished` finished
jobs, then runs each command `--runs` times as a user would (`python -m gpupool ...`, a fresh
process each time, $GPUPOOL_URL pointing at the daemon) and prints a markdown table of the
median and p90 (docs/benchmarks/cli.md records it). The commands take turns, round after round,
so a burst of load on the machine hits all of them alike. Bytecode caches are written as an
installed package has them (PYTHONDONTWRITEBYTECODE is dropped), after one warm-up run each.
With --before, each command also runs from another checkout's src/ (same daemon, same rounds),
for a before/after table measured under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_support import machine_load, percentile, start_daemon, url

from gpupool.api.client import Client

SPEC = "2xA100-40GB"


def _fill(address: str, count: int) -> int:
    """`count` jobs of `true` run to the end; the id of the last one."""
    body = {"argv": ["true"], "workdir": "/tmp", "compute": 1, "memory": "1Gi"}
    with Client(address) as client:
        ids = [int(client.call("POST", "/v1/jobs", json=body)["job"]["id"]) for _ in range(count)]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            jobs = client.call("GET", "/v1/jobs")["jobs"]
            if not jobs:
                return ids[-1]
            time.sleep(0.5)
    raise SystemExit(f"{len(jobs)} jobs still queued or running after 600 s")


def _commands(node_dir: Path, job_id: int) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "version": ["version"],
        "ps": ["ps"],
        "ps --all": ["ps", "--all"],
        "submit": ["submit", "--compute", "1", "--memory", "1Gi", "--", "true"],
        "describe": ["describe", str(job_id)],
        "gpus --simulate": ["gpus", "--simulate", SPEC, "--node-dir", str(node_dir)],
    }


def _time(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", *args], capture_output=True, env=env, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"gpupool {' '.join(args)} failed: {done.stderr.decode()}")
    return elapsed


def _row(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} | {percentile(values, 90) * 1000:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--finished", type=int, default=200)
    parser.add_argument("--before", type=Path, help="another checkout, timed beside this one")
    options = parser.parse_args()
    trees = {"after": Path(__file__).resolve().parents[1]}
    if options.before is not None:
        trees = {"before": options.before.resolve(), **trees}
    with tempfile.TemporaryDirectory(prefix="gpupool-cli-bench-") as tmp:
        root = Path(tmp)
        daemon = start_daemon(root, SPEC)
        try:
            address = url(root)
            last = _fill(address, options.finished)
            base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            envs = {
                tree: dict(base, GPUPOOL_URL=address, PYTHONPATH=str(path / "src"))
                for tree, path in trees.items()
            }
            commands = _commands(root / "node", last)
            times: dict[tuple[str, str], list[float]] = {
                (name, tree): [] for name in commands for tree in trees
            }
            for args in commands.values():
                for env in envs.values():
                    _time(args, env)  # warm-up: writes the bytecode caches
            for _ in range(options.runs):
                for name, args in commands.items():
                    for tree, env in envs.items():
                        times[name, tree].append(_time(args, env))
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    print(f"{options.runs} runs each, {options.finished} finished jobs, {machine_load()}\n")
    print("| command | " + " | ".join(f"{t} median ms | {t} p90 ms" for t in trees) + " |")
    print("|---|" + "---:|---:|" * len(trees))
    for name in commands:
        cells = " | ".join(_row(times[name, tree]) for tree in trees)
        print(f"| `gpupool {name}` | {cells} |")


if __name__ == "__main__":
    main()
