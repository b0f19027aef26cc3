"""`gpupool gpus`: the node's GPUs, MIG instances and processes, like nvidia-smi.

It parses with argparse (cli/plain.py says why) and prints plain-text tables (cli/texttable.py,
drawn in cli/gpus_view.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.cli import options, plain
from gpupool.cli.lines import say
from gpupool.core.errors import DriverNotFound, InvalidRequest
from gpupool.devices.factory import open_backend

if TYPE_CHECKING:
    from gpupool.devices.backend import GpuBackend

DEFAULT_WATCH_SECONDS = 2.0
#: a terminal's "cursor home, clear screen": each --watch frame replaces the last one
_CLEAR = "\x1b[H\x1b[2J"


def _watch(backend: GpuBackend, seconds: float, as_json: bool, url: str | None) -> None:
    """Refresh until Ctrl-C: a terminal shows one frame at a time; a pipe gets every frame, and
    JSON mode one document per line per refresh."""
    from gpupool.cli import gpus_view

    clear = _CLEAR if sys.stdout.isatty() else ""
    try:
        while True:
            if as_json:
                say(json.dumps(gpus_view.document(backend.snapshot())))
            else:
                say(clear + gpus_view.view(backend, url))
            time.sleep(seconds)
    except KeyboardInterrupt:
        return


def _open(args: argparse.Namespace) -> GpuBackend:
    """The GPUs the options name (a simulated node, else NVML's). Without a driver, the simulated
    node of the daemon at --url when it runs on one: `gpupool serve --simulate SPEC`, then
    `gpupool gpus`, shows the daemon's GPUs."""
    node_dir = Path(args.node_dir) if args.node_dir is not None else None
    try:
        return open_backend(args.simulate, node_dir)
    except DriverNotFound:
        from gpupool.cli import gpus_view

        daemons = (gpus_view.daemon_node(args.url) or {}).get("node_dir")
        if not daemons:
            raise
        return open_backend(None, Path(daemons))


def _gpus(args: argparse.Namespace) -> int:
    if args.seconds is not None and not args.watch:
        raise InvalidRequest(f"SECONDS {args.seconds:g} needs --watch (gpupool gpus --watch 5)")
    interval = DEFAULT_WATCH_SECONDS if args.seconds is None else args.seconds
    if not (math.isfinite(interval) and interval > 0):
        raise InvalidRequest(f"invalid watch interval {interval:g}: must be above 0 seconds")
    with _open(args) as backend:
        backend.prime()
        # the view's imports (the daemon's client, the arbiter's reader) run in the window
        from gpupool.cli import gpus_view

        if args.watch:
            _watch(backend, interval, args.json, args.url)
        elif args.json:
            plain.echo_json(gpus_view.document(backend.snapshot()))
        else:
            say(gpus_view.view(backend, args.url))
    return 0


def parser(name: str) -> argparse.ArgumentParser:
    """The parser of `gpus`, its run function as `run`."""
    command = plain.parser(
        name,
        "Show the GPUs, MIG instances, processes and compute shares' use (NVML, or simulated)."
        "\n\nWhen a node daemon answers at --url, each process is marked with its job; without"
        " an NVIDIA driver, a daemon running on a simulated node has its GPUs shown.",
        _gpus,
    )
    options.add(command, options.SIMULATE)
    options.add(command, options.NODE_DIR)
    options.add(command, options.JSON)
    command.add_argument(
        "--watch", action="store_true", help="Refresh every SECONDS (default 2) until Ctrl-C."
    )
    command.add_argument(
        "seconds", nargs="?", type=float, metavar="SECONDS", help="With --watch: between refreshes."
    )
    options.add(command, options.URL)
    return command
