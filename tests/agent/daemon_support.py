"""A real daemon on a simulated node, over its real socket, for the daemon tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.client import Client
from gpupool.core.errors import DaemonError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CUDA_JOB = str(EXAMPLES / "cuda_job.py")

#: one scrape of /metrics: each sample name's (labels, value) pairs
Samples = dict[str, list[tuple[dict[str, str], float]]]
T = TypeVar("T")


def cli(
    *args: str, url: str, check: bool = False, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`gpupool ARGS` as a user runs it, against the daemon at `url`."""
    env = dict(os.environ, GPUPOOL_URL=url)
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=check,
    )


@dataclass
class Daemon:
    """`gpupool serve` started in the background; `client` talks to it over its socket."""

    root: Path
    spec: str
    extra: tuple[str, ...] = ()
    #: variables the daemon gets on top of the test's environment (GPUPOOL_* ones are dropped)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    #: the node where `serve --simulate` puts it unless told (no --node-dir)
    default_node: bool = False

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    @property
    def url(self) -> str:
        return f"unix://{self.state_dir / 'gpupool.sock'}"

    def start(self) -> Daemon:
        args = ["--state-dir", str(self.state_dir)]
        if not self.default_node:
            args += ["--node-dir", str(self.node_dir)]
        if self.default_node or not self.node_dir.exists():
            args += ["--simulate", self.spec]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update(self.env)
        log = (self.root / "serve.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--cancel-grace", "1", *args, *self.extra],
            stdout=log,
            stderr=log,
            env=env,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with Client(self.url) as client:
                    client.call("GET", "/v1/health")
                return self
            except DaemonError:
                if self.process.poll() is not None:
                    raise AssertionError((self.root / "serve.log").read_text()) from None
                time.sleep(0.1)
        raise AssertionError("the daemon did not come up in 30 s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        self.process.wait(timeout=30)

    def client(self) -> Client:
        return Client(self.url)

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with self.client() as client:
            return client.call(method, path, **kwargs)

    def submit(self, argv: list[str], **share: Any) -> int:
        body = {"argv": argv, "workdir": "/tmp", **share}
        return int(self.call("POST", "/v1/jobs", json=body)["job"]["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        return self.call("GET", f"/v1/jobs/{job_id}")

    def wait(
        self,
        job_id: int,
        states: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
        timeout: float = 60,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {job}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def scrape(daemon: Daemon) -> Samples:
    """One scrape of the daemon's /metrics, over its socket."""
    transport = httpx.HTTPTransport(uds=str(daemon.state_dir / "gpupool.sock"))
    with httpx.Client(transport=transport, base_url="http://gpupool") as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def until(check: Callable[[], T], timeout: float = 20.0) -> T:
    """`check()`'s first truthy result, or its last one after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)
