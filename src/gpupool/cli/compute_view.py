"""Each compute share's measured use against its share, from the GPUs' arbiters: a table of
`gpupool gpus` and the closing line of `gpupool exec`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.cli import texttable
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.arbiter import ArbitratedShare, compute_use, find_share, view_file
from gpupool.isolation.arbiter_control import NODE_DIR, node_arbiter_dir, private_arbiter_dir

#: how long `gpupool gpus` watches the shares' GPU time (only when a share runs)
WINDOW_SECONDS = 0.5


@dataclass(frozen=True)
class ShareRow:
    gpu: int
    share: ArbitratedShare
    used_percent: float


def _directories(snapshot: NodeSnapshot) -> list[Path]:
    """The node's arbiter (root's: the daemon's and the pods'), and the caller's own if any."""
    simulated = Path(snapshot.node_dir) if snapshot.simulated and snapshot.node_dir else None
    node = simulated / "arbiter" if simulated is not None else NODE_DIR
    own = private_arbiter_dir(simulated)
    return [node] if node_arbiter_dir(simulated) == node else [node, own]


def sample_shares(snapshot: NodeSnapshot, window_s: float = WINDOW_SECONDS) -> list[ShareRow]:
    """Every running compute share of the node's GPUs and its charged use over `window_s`."""
    gpus = [gpu for gpu in snapshot.gpus if gpu.uuid]
    places = [(gpu, directory) for directory in _directories(snapshot) for gpu in gpus]
    uses = compute_use([view_file(directory, gpu.uuid) for gpu, directory in places], window_s)
    return [
        ShareRow(gpu.index, use.share, use.used_percent)
        for (gpu, _), per_gpu in zip(places, uses, strict=True)
        for use in per_gpu
    ]


def _share(share: ArbitratedShare) -> str:
    return f"{share.percent}% {share.policy}"


def shares_table(rows: Sequence[ShareRow]) -> list[str] | None:
    """The compute shares table, or None when no share runs."""
    if not rows:
        return None
    cells = [
        [
            str(row.gpu),
            str(row.share.pid),
            _share(row.share),
            row.share.priority or "-",
            f"{row.used_percent:.1f}%",
        ]
        for row in rows
    ]
    header = ["GPU", "PID", "Share", "Priority", "Used"]
    return ["Compute shares", *texttable.lines(header, cells, right=range(5))]


def shares_json(rows: Sequence[ShareRow]) -> list[dict[str, Any]]:
    """The `compute_shares` list of `gpupool gpus --json`."""
    return [
        {
            "gpu": row.gpu,
            "pid": row.share.pid,
            "percent": row.share.percent,
            "policy": row.share.policy,
            "priority": row.share.priority,
            "used_percent": round(row.used_percent, 1),
        }
        for row in rows
    ]


def exec_use_lines(
    directory: Path, share_id: int, gpus: Sequence[tuple[int, str]], seconds: float
) -> list[str]:
    """What a finished `gpupool exec` share was charged of each of its GPUs over its `seconds`
    of run, against its share; nothing where it never asked for a lease."""
    if seconds <= 0:
        return []
    lines = []
    for index, uuid in gpus:
        share = find_share(directory, uuid, share_id)
        if share is None or share.pid == 0:
            continue
        used = 100.0 * share.busy_ns / (seconds * 1e9)
        priority = f", priority {share.priority}" if share.priority else ""
        lines.append(
            f"compute use on GPU {index}: {used:.1f}% of the GPU over {seconds:.1f} s "
            f"(share {_share(share)}{priority})"
        )
    return lines
