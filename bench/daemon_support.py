"""Start and stop a `gpupool serve` on a simulated node for the daemon benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpupool.api.client import Client
from gpupool.core.errors import DaemonError


def start_daemon(
    root: Path, spec: str | None, *extra: str, log_name: str = "serve.log"
) -> subprocess.Popen[bytes]:
    """`gpupool serve EXTRA...` with its state under `root`, once its socket answers: on the
    simulated node of `spec` in `root` (made when new), or on the real GPUs when `spec` is None."""
    args = ["--state-dir", str(root / "state"), *extra]
    if spec is not None:
        args += ["--node-dir", str(root / "node")]
        if not (root / "node").exists():
            args += ["--simulate", spec]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    log = (root / log_name).open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "serve", *args], stdout=log, stderr=log, env=env
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with Client(url(root)) as client:
                client.call("GET", "/v1/health")
            return process
        except DaemonError:
            if process.poll() is not None:
                raise SystemExit((root / log_name).read_text()) from None
            time.sleep(0.05)
    raise SystemExit("the daemon did not answer within 60 s")


def url(root: Path) -> str:
    return f"unix://{root / 'state' / 'gpupool.sock'}"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def machine_load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"
