"""Services for the tests: a daemon with its router, the example model server, load through it."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import EXAMPLES, Daemon, until

MODEL_SERVER = str(EXAMPLES / "model_server.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Routed:
    """A daemon started with `--router`; `base` is the router's URL."""

    daemon: Daemon
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create(
        self, name: str, *server_args: str, argv: list[str] | None = None, **body: Any
    ) -> dict[str, Any]:
        command = argv or [sys.executable, MODEL_SERVER, "--memory-mib", "256", *server_args]
        sent = {"name": name, "argv": command, "workdir": "/tmp", "memory": "2Gi", "compute": 20}
        sent.update(body)
        return self.daemon.call("POST", "/v1/services", json=sent)["service"]

    def service(self, name: str) -> dict[str, Any]:
        return self.daemon.call("GET", f"/v1/services/{name}")

    def ready(self, name: str, count: int = 1, timeout: float = 30) -> dict[str, Any]:
        found = until(lambda: self._at_least(name, count), timeout)
        assert found, self.service(name)
        return found

    def _at_least(self, name: str, count: int) -> dict[str, Any] | None:
        service = self.service(name)
        return service if service["replicas"]["ready"] >= count else None


def start_routed(root: Path, spec: str = "2xA100-40GB") -> Routed:
    port = free_port()
    daemon = Daemon(root, spec, ("--router", f"127.0.0.1:{port}")).start()
    return Routed(daemon, port)


def routed_on(spec: str = "2xA100-40GB") -> Callable[[Path], Iterator[Routed]]:
    """A test module's `routed` fixture: a daemon with its router on a simulated node of `spec`,
    started, yielded, then stopped with nothing of it left behind."""

    @pytest.fixture
    def routed(tmp_path: Path) -> Iterator[Routed]:
        running = start_routed(tmp_path, spec)
        yield running
        running.daemon.stop()
        _kill_jobs(running.daemon)

    return routed


@dataclass
class Load:
    """Requests sent in a loop by `workers` threads until stopped, their answers counted."""

    url: str
    workers: int
    #: seconds each worker waits after each answer (0: back to back)
    pause: float = 0.0
    statuses: Counter[int | str] = field(default_factory=Counter)
    ports: Counter[int] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _work(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    answer = client.get(self.url)
                    code: int | str = answer.status_code
                    port = answer.json().get("port") if code == 200 else None
                except httpx.HTTPError as err:
                    code, port = type(err).__name__, None
                with self._lock:
                    self.statuses[code] += 1
                    if port is not None:
                        self.ports[port] += 1
                self._stop.wait(self.pause)

    @contextmanager
    def running(self) -> Iterator[Load]:
        threads = [threading.Thread(target=self._work, daemon=True) for _ in range(self.workers)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(90)


def event_times(base: str, path: str) -> tuple[dict[str, str], list[tuple[float, bytes]]]:
    """GET `path` over a raw socket: the answer's headers and each body read's (time, bytes),
    as they arrived."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        reads = [(time.monotonic(), body)] if body else []
        while not body.endswith(b"0\r\n\r\n"):
            piece = sock.recv(65536)
            if not piece:
                break
            body += piece
            reads.append((time.monotonic(), piece))
    return {"status": lines[0].split()[1], **headers}, reads
