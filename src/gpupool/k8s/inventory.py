"""A node's GPU inventory as the device plugin publishes it on the Node (an annotation)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from gpupool.core.errors import InvalidRequest
from gpupool.devices.snapshot import NodeSnapshot


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of a node: index (NVML order), UUID, model, memory in bytes, health."""

    index: int
    uuid: str
    model: str
    memory: int
    healthy: bool = True


def from_snapshot(snapshot: NodeSnapshot) -> list[GpuInfo]:
    """The inventory of a devices-layer snapshot (a lost GPU is listed, unhealthy)."""
    return [
        GpuInfo(g.index, g.uuid, g.model, max(g.memory_total, 0), g.healthy) for g in snapshot.gpus
    ]


def encode(gpus: list[GpuInfo]) -> str:
    return json.dumps([asdict(g) for g in gpus], separators=(",", ":"))


def _gpu(entry: Any) -> GpuInfo:
    if not isinstance(entry, dict):
        raise TypeError("an entry is not an object")
    gpu = GpuInfo(
        int(entry["index"]),
        str(entry["uuid"]),
        str(entry["model"]),
        int(entry["memory"]),
        bool(entry.get("healthy", True)),
    )
    if gpu.index < 0 or gpu.memory < 0:
        raise ValueError("negative index or memory")
    return gpu


def decode(text: str) -> list[GpuInfo]:
    """The inventory in a node annotation; a malformed one is InvalidRequest naming the fault."""
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise TypeError("not a list")
        return [_gpu(entry) for entry in data]
    except (ValueError, TypeError, KeyError) as err:
        raise InvalidRequest(f"malformed GPU inventory annotation: {err}") from err
