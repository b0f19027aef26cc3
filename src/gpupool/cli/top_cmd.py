"""`gpupool top`: a live terminal view of the daemon's GPUs and jobs; q or Ctrl-C quits."""

from __future__ import annotations

import contextlib
import math
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console
from rich.live import Live

from gpupool.api.client import Client
from gpupool.cli import options
from gpupool.cli.top_view import frame
from gpupool.core.errors import DaemonError, InvalidRequest

QUIT_KEYS = (b"q", b"Q")
#: lines of a frame printed to a pipe (a terminal's own height otherwise)
PIPE_HEIGHT = 24


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """stdin in cbreak mode (keys arrive one by one, Ctrl-C still interrupts), restored after;
    None when stdin is not a terminal (then only Ctrl-C quits)."""
    if not sys.stdin.isatty():
        yield None
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_within(fd: int | None, seconds: float) -> bool:
    """Wait up to `seconds` for a key; True when it is a quit key."""
    if fd is None:
        time.sleep(seconds)
        return False
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 32)[:1] in QUIT_KEYS:
            return True
    return False


def _live(client: Client, console: Console, interval: float) -> None:
    data: dict[str, Any] = client.call("GET", "/v1/dashboard")
    with (
        _keys() as fd,
        Live(console=console, screen=True, auto_refresh=False) as live,
    ):
        while True:
            live.update(frame(data, console.height), refresh=True)
            if _quit_within(fd, interval):
                return
            try:
                data = client.call("GET", "/v1/dashboard")
            except DaemonError:  # a restarting daemon: keep the last frame, say so, try again
                live.update(frame(data, console.height, "daemon not answering"), refresh=True)
                if _quit_within(fd, interval):
                    return


def register(app: typer.Typer) -> None:
    """Add `top` to the app."""

    @app.command("top")
    def top(
        url: str | None = options.typer_option(options.URL),
        once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
        interval: float = typer.Option(
            2.0, "--interval", metavar="SECONDS", help="Seconds between refreshes."
        ),
    ) -> None:
        """Watch the daemon's GPUs and jobs live (fits 80x24); q or Ctrl-C quits."""
        if not (math.isfinite(interval) and interval > 0):
            raise InvalidRequest(f"invalid --interval {interval:g}: must be above 0 seconds")
        console = Console()
        with Client(url) as client:
            if once:
                height = console.height if console.is_terminal else PIPE_HEIGHT
                console.print(frame(client.call("GET", "/v1/dashboard"), height))
                return
            with contextlib.suppress(KeyboardInterrupt):
                _live(client, console, interval)
