"""A daemon with its router on a simulated node, and the example model server's services on it,
for the inference benchmarks (bench/inference_pool.py, bench/router_proxies.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from gpupool.agent.mps import REAL_CONTROL
from gpupool.api.client import Client
from gpupool.core.errors import DaemonError
from gpupool.devices.sim import mps_twin

ROOT = Path(__file__).resolve().parents[1]
MODEL_SERVER = str(ROOT / "examples" / "model_server.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Pool:
    """`gpupool serve --simulate SPEC --router` in `root`, until the block ends."""

    def __init__(self, root: Path, spec: str | None, extra: tuple[str, ...] = ()) -> None:
        """`spec`: the simulated node's GPUs (None: this machine's real GPUs); `extra`: more
        options of `gpupool serve`."""
        self.root = root
        self.extra = extra
        self.port = free_port()
        self.url = f"unix://{root / 'state' / 'gpupool.sock'}"
        self.spec = spec
        self.log = (root / "serve.log").open("ab")
        self.process = self.start()

    def start(self) -> subprocess.Popen[bytes]:
        """Start the daemon (again: a node made at the first start is reused) and wait for it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        node = self.root / "node"
        args = ["--state-dir", str(self.root / "state"), "--router", f"127.0.0.1:{self.port}"]
        if self.spec:  # a simulated node: made at the first start, reused at the next ones
            args += ["--node-dir", str(node)] + ([] if node.exists() else ["--simulate", self.spec])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--cancel-grace", "2", *args, *self.extra],
            stdout=self.log,
            stderr=self.log,
            env=env,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.call("GET", "/v1/health")
                return self.process
            except DaemonError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise SystemExit((self.root / "serve.log").read_text()) from None
                time.sleep(0.1)

    @property
    def router(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with Client(self.url) as client:
            return client.call(method, path, **kwargs)

    def create(self, name: str, *server_args: str, **body: Any) -> dict[str, Any]:
        sent = {
            "name": name,
            "argv": [sys.executable, MODEL_SERVER, "--memory-mib", "1024", *server_args],
            "workdir": "/tmp",
            "memory": "8Gi",
            "compute": 25,
        }
        sent.update(body)
        return self.call("POST", "/v1/services", json=sent)["service"]

    def service(self, name: str) -> dict[str, Any]:
        return self.call("GET", f"/v1/services/{name}")

    def wait_ready(self, name: str, count: int = 1, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            service = self.service(name)
            if service["replicas"]["ready"] >= count:
                return service
            time.sleep(0.05)
        raise SystemExit(f"service {name} not ready: {json.dumps(self.service(name))}")

    def ready_ports(self, name: str) -> list[int]:
        service = self.wait_ready(name)
        return [r["port"] for r in service["replica_list"] if r["state"] == "ready"]

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)
        with contextlib.suppress(OSError, ValueError):  # the router outlives it too
            os.kill(int((self.root / "state" / "router.pid").read_text()), signal.SIGKILL)
        for pids in (self.root / "state").glob("jobs/*/pids.json"):  # replicas outlive it
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError, OSError):
                os.killpg(json.loads(pids.read_text())["job"], signal.SIGKILL)
        # and so do the MPS control daemons it started for mode mps: told to quit
        control = mps_twin.command() if self.spec is not None else [REAL_CONTROL]
        for pipe in (self.root / "state").glob("mps/*/pipe"):
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(control, input="quit\n", text=True, env=env, timeout=30, check=False)
        self.log.close()
