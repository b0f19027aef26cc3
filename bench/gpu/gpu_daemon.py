"""The node daemon the GPU checks run their jobs through: started in a scratch directory (its
state and, on a simulated node, the node itself), awaited until it answers, its log kept."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpupool.api.client import Client
from gpupool.core.errors import DaemonError


def daemon_url(root: Path) -> str:
    return f"unix://{root / 'state' / 'gpupool.sock'}"


def start_daemon(root: Path, simulate: str | None, *extra: str) -> subprocess.Popen[bytes]:
    """`gpupool serve EXTRA...` with its state under `root`; exits the check with the daemon's
    log when it dies before answering, or after 60 s."""
    args = [sys.executable, "-m", "gpupool", "serve", "--state-dir", str(root / "state"), *extra]
    if simulate:
        args += ["--simulate", simulate, "--node-dir", str(root / "node")]
    log = (root / "serve.log").open("ab")
    daemon = subprocess.Popen(args, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with Client(daemon_url(root)) as client:
                client.call("GET", "/v1/health")
            return daemon
        except DaemonError:
            if daemon.poll() is not None:
                raise SystemExit((root / "serve.log").read_text()) from None
            time.sleep(0.1)
    raise SystemExit("the daemon did not start within 60 s")
