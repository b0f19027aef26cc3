"""What the demos share: a headline, a free port for the router, `gpupool` run as a user types
it (the command shown, then what it printed), and a wait for the daemon to get somewhere."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Mapping
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
