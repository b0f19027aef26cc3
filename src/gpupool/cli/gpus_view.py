"""What `gpupool gpus` shows: the nvidia-smi-like tables of one snapshot, marked by the daemon.

Apart from cli/gpus_cmd.py so that the command can start the backend's utilisation window before
it imports this (the daemon's client among it): the imports then run inside the window.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from collections.abc import Mapping
from typing import Any

from gpupool.api.client import Client
from gpupool.cli import texttable
from gpupool.cli.compute_view import ShareRow, sample_shares, shares_json, shares_table
from gpupool.cli.gpus_jobs import daemon_jobs, elastic_lines, mig_jobs
from gpupool.cli.gpus_marks import UNSEEN, Marks, daemon_marks
from gpupool.core.errors import GpupoolError
from gpupool.core.units import format_bytes
from gpupool.devices.backend import GpuBackend
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot


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


def header(snapshot: NodeSnapshot) -> list[str]:
    """Where the numbers come from, and when (so a stale --watch shows), in the terminal's width
    ($COLUMNS in a pipe): a simulated node's long directory may take more than one line."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.timestamp))
    if snapshot.simulated:
        where = f"simulated node {snapshot.node_dir} (simulated GPUs)"
    else:
        where = f"NVIDIA driver {snapshot.driver}"
    width = shutil.get_terminal_size().columns
    lines = textwrap.wrap(where, width)
    if len(lines[-1]) + 2 + len(when) <= width:
        return [*lines[:-1], f"{lines[-1]}  {when}"]
    return [*lines, when]


def gpu_table(snapshot: NodeSnapshot) -> list[str]:
    # 80 columns hold every column: the model stands for the name (which --json has)
    rows = [
        [
            str(gpu.index),
            gpu.model,
            _memory(gpu.memory_used, gpu.memory_total),
            _optional(gpu.utilization, "%"),
            _optional(gpu.temperature, "C"),
            _optional(None if gpu.power_w is None else f"{gpu.power_w:.0f}", "W"),
            _mig_mode(gpu),
            "ok" if gpu.healthy else (gpu.error or "error"),
        ]
        for gpu in snapshot.gpus
    ]
    header = ["GPU", "Model", "Memory used / total", "Util", "Temp", "Power", "MIG", "Health"]
    return ["GPUs", *texttable.lines(header, rows, right={0, 2, 3, 4, 5})]


def mig_table(snapshot: NodeSnapshot, users: Mapping[str, str] | None = None) -> list[str] | None:
    """The MIG instances; `users` (MIG-UUID -> the daemon's job on it) adds a Job column."""
    found = [(g, i) for g in snapshot.gpus if g.mig is not None for i in g.mig.instances]
    if not found:
        return None
    header = ["GPU", "GI", "CI", "Profile", "Slices", "Memory", "UUID"] + (["Job"] if users else [])
    rows = []
    for gpu, instance in found:
        start = instance.placement_start
        cells = [
            str(gpu.index),
            str(instance.gi_id),
            _optional(instance.ci_id),
            instance.profile,
            "n/a" if start is None else f"{start}:{instance.placement_size}",
            format_bytes(instance.memory_total),
            instance.uuid or "",
        ]
        if users:
            cells.append(users.get(instance.uuid or "", "-"))
        rows.append(cells)
    return ["MIG instances", *texttable.lines(header, rows)]


def process_table(snapshot: NodeSnapshot, marks: Marks | None = None) -> list[str]:
    """The GPU processes; with `marks` (the daemon's), each one's job and share too."""
    header = ["GPU", "PID", "Name", "Memory", "SM util"] + (["Job"] if marks is not None else [])
    rows = []
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
            rows.append(row)
    if not rows:
        rows.append(["", "", "no processes", *[""] * (len(header) - 3)])
    return ["Processes", *texttable.lines(header, rows, right={0, 1, 3, 4})]


def daemon_node(url: str | None) -> dict[str, Any] | None:
    """The node daemon's view of the node (GET /v1/node), or None when no daemon answers."""
    try:
        with Client(url) as client:
            return client.call("GET", "/v1/node", timeout=2.0)  # a view must not hang
    except GpupoolError:
        return None


def mps_table(node: dict[str, Any] | None) -> list[str] | None:
    """Each GPU's MPS server and its client jobs, as the node daemon runs them (`node`, its
    view); None when no daemon answered or none runs an MPS server."""
    if node is None:
        return None
    servers = [(gpu["index"], gpu["mps"]) for gpu in node.get("gpus", []) if gpu.get("mps")]
    if not servers:
        return None
    rows = [
        [
            str(index),
            str(mps["server"]),
            ", ".join(f"{c['job']}:{c['pid']}" for c in mps["clients"]),
        ]
        for index, mps in servers
    ]
    header = ["GPU", "Server PID", "Clients (job:pid)"]
    return ["MPS servers (node daemon)", *texttable.lines(header, rows, right={0, 1})]


def placement_lines(node: dict[str, Any] | None) -> list[str] | None:
    """The daemon's placement policy and the target workload it learnt (`node`, its view);
    None when no daemon answered."""
    if node is None or "policy" not in node:
        return None
    lines = [f"Placement (node daemon): policy {node['policy']}"]
    shapes = node.get("target_workload") or []
    if shapes:
        lines.append("target workload (recent shapes):")
    for shape in shapes:
        models = f" of {', '.join(shape['gpu_models'])}" if shape.get("gpu_models") else ""
        # a share's packing price: what placement counts it worth (docs/placement.md)
        worth = f", worth {shape['gpu_value']:.2f} GPU" if "gpu_value" in shape else ""
        lines.append(
            f"  {shape['gpus']} GPU x {shape['gpu_milli'] / 10:g}%{_shape_memory(shape)}"
            f"{models}: {shape['probability'] * 100:.1f}%{worth}"
        )
    return lines


def _shape_memory(shape: Mapping[str, Any]) -> str:
    """The GPU memory a shape asks, as its submit did: shapes alike in compute differ in it."""
    if shape.get("memory"):
        return f", {format_bytes(int(shape['memory']))}"
    if shape.get("memory_share"):
        return f", {float(shape['memory_share']) * 100:g}% of memory"
    if shape.get("proportional"):
        return ", memory in proportion"
    return ""


def render(
    snapshot: NodeSnapshot,
    url: str | None = None,
    shares: list[ShareRow] | None = None,
    users: Mapping[str, str] | None = None,
    node: dict[str, Any] | None = None,
) -> str:
    """The whole nvidia-smi-like view of one snapshot: processes marked by the daemon at `url`,
    the compute shares' use, `users` (see mig_table) and the daemon's MPS servers (`node`, see
    mps_table); tables a blank line apart."""
    parts: list[list[str]] = [header(snapshot), gpu_table(snapshot)]
    migs = mig_table(snapshot, users)
    if migs is not None:
        parts.append(migs)
    busy = any(gpu.processes for gpu in snapshot.gpus)
    marks, why_not = daemon_marks(url) if busy else (None, "")
    processes = process_table(snapshot, marks)
    parts.append([*processes, why_not] if why_not else processes)
    for table in (mps_table(node), shares_table(shares or []), placement_lines(node)):
        if table is not None:
            parts.append(table)
    return "\n\n".join("\n".join(part) for part in parts)


def document(snapshot: NodeSnapshot) -> dict[str, object]:
    """`--json`: the snapshot and its compute shares' use."""
    return snapshot.to_json() | {"compute_shares": shares_json(sample_shares(snapshot))}


def view(backend: GpuBackend, url: str | None) -> str:
    # the daemon is asked first: its answer comes while the backend's utilisation window runs
    jobs = daemon_jobs(url)
    users, node = mig_jobs(jobs), daemon_node(url)
    snapshot = backend.snapshot()
    shown = render(snapshot, url, sample_shares(snapshot), users, node)
    elastic = elastic_lines(jobs)
    if elastic:  # elastic memory: what is in host memory rather than on the GPUs
        shown += "\n\nIn host memory:\n" + "\n".join(f"  {line}" for line in elastic)
    return shown
