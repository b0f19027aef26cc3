"""What the demos share: a headline, a free port for the router, the daemon on a simulated node
and everything of it stopped at the end, `gpupool` run as a user types it (the command shown,
then what it printed), and a wait for the daemon to get somewhere."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent


def bold(text: str) -> None:
    print(f"\n\033[1m{text}\033[0m", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(gpupool: str, env: Mapping[str, str]) -> Callable[..., str]:
    """`run(*args, show=True)`: `gpupool ARGS`, shown as typed and printed as it answered; its
    output; a failure ends the demo with the command's error."""

    def run(*args: str, show: bool = True) -> str:
        if show:
            print("$ gpupool " + " ".join(args).replace(str(HERE) + "/", ""), flush=True)
        done = subprocess.run([gpupool, *args], env=env, capture_output=True, text=True)
        if show:
            print(done.stdout, end="", flush=True)
        if done.returncode:
            raise SystemExit(done.stderr)
        return done.stdout

    return run


def until(check: Callable[[], bool], timeout: float) -> bool:
    """Whether `check` came true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def simulated_daemon(
    gpupool: str, spec: str, work: Path, port: int, env: Mapping[str, str]
) -> Iterator[None]:
    """`gpupool serve --router 127.0.0.1:PORT` on a simulated node of `spec` in `work`, once it
    answers; at the end it is stopped, with what outlives it on purpose (its router process and
    the replicas), and `work` removed."""
    daemon = subprocess.Popen(
        [
            *(gpupool, "serve", "--simulate", spec, "--node-dir", str(work / "node")),
            *("--state-dir", str(work / "state"), "--router", f"127.0.0.1:{port}"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def answers() -> bool:
            return subprocess.run([gpupool, "ps"], env=env, capture_output=True).returncode == 0

        if not until(answers, 30):
            raise SystemExit("the demo's daemon did not answer in 30 s")
        yield
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((work / "state" / "router.pid").read_text()), signal.SIGKILL)
        for pids in (work / "state").glob("jobs/*/pids.json"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(json.loads(pids.read_text())["job"], signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
