"""kill -9 of the daemon at random moments while jobs are submitted, started and finishing.

    python bench/daemon_kill9.py [--trials 100] [--seed 1]

Each trial: a client submits jobs (each appends its name to a marks file, sleeps a random
0-0.6 s and exits with its own code), the daemon is killed with SIGKILL at a random moment
(0-1.5 s in), and restarted. At the end every acknowledged job must be stored once, have run
exactly once (one mark), and carry its own exit code. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_support import machine_load, start_daemon, url

from gpupool.api.client import Client
from gpupool.core.errors import GpupoolError


def _submitter(
    root: Path,
    rng: random.Random,
    stop: threading.Event,
    acked: dict[str, int],
    marks: Path,
    counter: list[int],
) -> None:
    try:
        with Client(url(root)) as client:
            while not stop.is_set():
                counter[0] += 1
                name, code = f"j{counter[0]}", rng.randrange(0, 100)
                script = f"echo $0 >> {marks}; sleep {rng.uniform(0, 0.6):.2f}; exit {code}"
                body = {
                    "argv": ["sh", "-c", script, name],
                    "compute": rng.choice([10, 25, 50]),
                    "name": name,
                    "workdir": "/tmp",
                }
                client.call("POST", "/v1/jobs", json=body)
                acked[name] = code
                time.sleep(rng.uniform(0, 0.1))
    except GpupoolError:
        pass  # the daemon died under us: the next trial goes on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    acked: dict[str, int] = {}
    counter = [0]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpupool-kill9-") as tmp:
        root = Path(tmp)
        marks = root / "marks"
        marks.touch()
        daemon = start_daemon(root, "2xA100-40GB")
        for _ in range(args.trials):
            stop = threading.Event()
            thread = threading.Thread(
                target=_submitter, args=(root, rng, stop, acked, marks, counter)
            )
            thread.start()
            time.sleep(rng.uniform(0, 1.5))
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.wait()
            stop.set()
            thread.join()
            daemon = start_daemon(root, "2xA100-40GB")
        with Client(url(root)) as client:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                jobs = client.call("GET", "/v1/jobs", params={"all": True})["jobs"]
                if all(j["state"] not in ("queued", "running") for j in jobs):
                    break
                time.sleep(0.5)
        daemon.terminate()
        daemon.wait()
        ran = marks.read_text().split()
    by_name: dict[str, list[dict[str, object]]] = {}
    for job in jobs:
        by_name.setdefault(str(job["name"]), []).append(job)
    lost = [n for n in acked if n not in by_name]
    doubled = [n for n, js in by_name.items() if len(js) > 1 or ran.count(n) > 1]
    never_ran = [n for n in by_name if ran.count(n) == 0]
    wrong = [n for n, js in by_name.items() if n in acked and js[0]["exit_code"] != acked[n]]
    print(
        f"{args.trials} kill -9 trials (seed {args.seed}) in {time.monotonic() - began:.0f} s; "
        f"{machine_load()}\n"
    )
    print("| what | result |")
    print("|---|---|")
    print(f"| jobs acknowledged / stored | {len(acked)} / {len(jobs)} |")
    print(f"| lost (acknowledged, not stored) | {len(lost)} {lost[:5]} |")
    print(f"| stored twice or run twice | {len(doubled)} {doubled[:5]} |")
    print(f"| stored but never run | {len(never_ran)} {never_ran[:5]} |")
    print(f"| exit code wrong | {len(wrong)} {wrong[:5]} |")


if __name__ == "__main__":
    main()
