"""`gpupool gpus`: the node's GPUs, MIG instances and processes, like nvidia-smi."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpupool.api.client import Client
from gpupool.cli import options
from gpupool.cli.compute_view import ShareRow, sample_shares, shares_json, shares_table
from gpupool.cli.gpus_jobs import mig_jobs
from gpupool.cli.gpus_marks import UNSEEN, Marks, daemon_marks
from gpupool.core.errors import GpupoolError, InvalidRequest
from gpupool.core.units import format_bytes
from gpupool.devices.backend import GpuBackend
from gpupool.devices.factory import open_backend
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot

DEFAULT_WATCH_SECONDS = 2.0


def _optional(value: object, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value}{suffix}"


def _memory(used: int | None, total: int | None = None) -> str:
    if used is None:
        return "n/a"
    return format_bytes(used) if total is None else f"{format_bytes(used)} / {format_bytes(total)}"


def _mig_mode(gpu: GpuSnapshot) -> str:
    if gpu.mig is None:
        return "n/a"
    mode = "on" if gpu.mig.current else "off"
    if gpu.mig.pending != gpu.mig.current:
        mode += f" ({'on' if gpu.mig.pending else 'off'} after reset)"
    return mode


def header(snapshot: NodeSnapshot) -> Text:
    """The first line: where the numbers come from, and when (so a stale --watch shows)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.timestamp))
    if snapshot.simulated:
        where = f"simulated node {snapshot.node_dir} (simulated GPUs)"
        return Text(f"{where}  {when}", style="bold yellow")
    return Text(f"NVIDIA driver {snapshot.driver}  {when}", style="bold")


def gpu_table(snapshot: NodeSnapshot) -> Table:
    # 80 columns hold every column unwrapped: the model stands for the name (which --json has)
    table = Table(title="GPUs", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("GPU", "Model", "Memory used / total", "Util", "Temp", "Power"):
        table.add_column(column, justify="left" if column == "Model" else "right", no_wrap=True)
    table.add_column("MIG")
    table.add_column("Health")
    for gpu in snapshot.gpus:
        power = None if gpu.power_w is None else f"{gpu.power_w:.0f}"
        health = Text("ok", style="green") if gpu.healthy else Text(gpu.error or "error", "red")
        table.add_row(
            str(gpu.index),
            gpu.model,
            _memory(gpu.memory_used, gpu.memory_total),
            _optional(gpu.utilization, "%"),
            _optional(gpu.temperature, "C"),
            _optional(power, "W"),
            _mig_mode(gpu),
            health,
        )
    return table


def mig_table(snapshot: NodeSnapshot, users: Mapping[str, str] | None = None) -> Table | None:
    """The MIG instances; `users` (MIG-UUID -> the daemon's job on it) adds a Job column."""
    rows = [(g, i) for g in snapshot.gpus if g.mig is not None for i in g.mig.instances]
    if not rows:
        return None
    # no column rules: they would cost the 7 columns a full MIG UUID needs in 80
    table = Table(title="MIG instances", title_justify="left", box=None, pad_edge=False)
    for column in ("GPU", "GI", "CI", "Profile", "Slices", "Memory"):
        table.add_column(column, no_wrap=True)
    table.add_column("UUID", overflow="fold")
    if users:
        table.add_column("Job", no_wrap=True)
    for gpu, instance in rows:
        start = instance.placement_start
        placement = "n/a" if start is None else f"{start}:{instance.placement_size}"
        cells = [
            str(gpu.index),
            str(instance.gi_id),
            _optional(instance.ci_id),
            instance.profile,
            placement,
            format_bytes(instance.memory_total),
            instance.uuid or "",
        ]
        if users:
            cells.append(users.get(instance.uuid or "", "-"))
        table.add_row(*cells)
    return table


def process_table(snapshot: NodeSnapshot, marks: Marks | None = None) -> Table:
    """The GPU processes; with `marks` (the daemon's), each one's job and share too."""
    table = Table(title="Processes", title_justify="left", box=box.SIMPLE_HEAD)
    columns = ("GPU", "PID", "Name", "Memory", "SM util") + (("Job",) if marks is not None else ())
    for column in columns:
        table.add_column(column, justify="left" if column in ("Name", "Job") else "right")
    for gpu in snapshot.gpus:
        for process in gpu.processes:
            row = [
                str(gpu.index),
                str(process.pid),
                process.name,
                _memory(process.memory_used),
                _optional(process.gpu_utilization, "%"),
            ]
            if marks is not None:
                row.append(marks.get((gpu.index, process.pid), UNSEEN))
            table.add_row(*row)
    if not table.row_count:
        table.add_row("", "", "no processes", *[""] * (len(columns) - 3))
    return table


def mps_table(url: str | None) -> Table | None:
    """Each GPU's MPS server and its client jobs, as the node daemon (if one answers) runs them;
    None when no daemon answers or none runs an MPS server."""
    try:
        with Client(url) as client:
            node = client.call("GET", "/v1/node", timeout=2.0)  # a view must not hang
    except GpupoolError:
        return None
    servers = [(gpu["index"], gpu["mps"]) for gpu in node.get("gpus", []) if gpu.get("mps")]
    if not servers:
        return None
    table = Table(title="MPS servers (node daemon)", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("GPU", "Server PID", "Clients (job:pid)"):
        table.add_column(column, justify="left" if column.startswith("Clients") else "right")
    for index, mps in servers:
        clients = ", ".join(f"{c['job']}:{c['pid']}" for c in mps["clients"])
        table.add_row(str(index), str(mps["server"]), clients)
    return table


def render(
    snapshot: NodeSnapshot,
    url: str | None = None,
    shares: list[ShareRow] | None = None,
    users: Mapping[str, str] | None = None,
) -> RenderableType:
    """The whole nvidia-smi-like view of one snapshot: processes marked by the daemon at `url`,
    the compute shares' use, and `users` (see mig_table)."""
    parts: list[RenderableType] = [header(snapshot), gpu_table(snapshot)]
    migs = mig_table(snapshot, users)
    if migs is not None:
        parts.append(migs)
    busy = any(gpu.processes for gpu in snapshot.gpus)
    marks, why_not = daemon_marks(url) if busy else (None, "")
    parts.append(process_table(snapshot, marks))
    if why_not:
        parts.append(Text(why_not, style="dim"))
    mps = mps_table(url)
    if mps is not None:
        parts.append(mps)
    compute = shares_table(shares or [])
    if compute is not None:
        parts.append(compute)
    return Group(*parts)


def _document(snapshot: NodeSnapshot) -> dict[str, object]:
    """`--json`: the snapshot and its compute shares' use."""
    return snapshot.to_json() | {"compute_shares": shares_json(sample_shares(snapshot))}


def _view(snapshot: NodeSnapshot, url: str | None) -> RenderableType:
    return render(snapshot, url, sample_shares(snapshot), mig_jobs(url))


def _watch(
    backend: GpuBackend, seconds: float, as_json: bool, console: Console, url: str | None
) -> None:
    """Refresh until Ctrl-C; JSON mode prints one document per line per refresh."""
    try:
        if as_json:
            while True:
                typer.echo(json.dumps(_document(backend.snapshot())))
                time.sleep(seconds)
        # a node taller than the terminal scrolls rather than losing its last GPUs
        first = _view(backend.snapshot(), url)
        with Live(first, console=console, auto_refresh=False, vertical_overflow="visible") as live:
            while True:
                time.sleep(seconds)
                live.update(_view(backend.snapshot(), url), refresh=True)
    except KeyboardInterrupt:
        return


def register(app: typer.Typer) -> None:
    """Add `gpus` to the app."""

    @app.command("gpus")
    def gpus(
        simulate: str | None = options.typer_option(options.SIMULATE),
        node_dir: Path | None = options.typer_option(options.NODE_DIR),
        as_json: bool = options.typer_option(options.JSON),
        watch: bool = typer.Option(
            False, "--watch", help="Refresh every SECONDS (default 2) until Ctrl-C."
        ),
        seconds: float | None = typer.Argument(
            None, metavar="[SECONDS]", help="With --watch: seconds between refreshes."
        ),
        url: str | None = options.typer_option(options.URL),
    ) -> None:
        """Show the GPUs, MIG instances, processes and compute shares' use (NVML, or simulated).

        When a node daemon answers at --url, each process is marked with its job.
        """
        if seconds is not None and not watch:
            raise InvalidRequest(f"SECONDS {seconds:g} needs --watch (gpupool gpus --watch 5)")
        interval = DEFAULT_WATCH_SECONDS if seconds is None else seconds
        if not (math.isfinite(interval) and interval > 0):
            raise InvalidRequest(f"invalid watch interval {interval:g}: must be above 0 seconds")
        console = Console()
        with open_backend(simulate, node_dir) as backend:
            if watch:
                _watch(backend, interval, as_json, console, url)
            elif as_json:
                typer.echo(json.dumps(_document(backend.snapshot()), indent=2))
            else:
                console.print(_view(backend.snapshot(), url))
