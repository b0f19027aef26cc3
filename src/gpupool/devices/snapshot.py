"""Timestamped, immutable views of GPUs: what the layers above consume, never live handles."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ProcessKind(StrEnum):
    """Which of the driver's lists a process is in: NVML keeps compute processes (a CUDA context)
    apart from graphics ones (OpenGL, Vulkan: a display server, a desktop), as nvidia-smi's C and
    G; a process with both contexts is in both."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    BOTH = "compute+graphics"

    @classmethod
    def of(cls, compute: bool, graphics: bool) -> ProcessKind:
        """The kind of a process found in the compute list, the graphics list, or both."""
        if compute and graphics:
            return cls.BOTH
        return cls.GRAPHICS if graphics else cls.COMPUTE


@dataclass(frozen=True)
class ProcessInfo:
    """A process on a GPU; `memory_used` None where the driver does not say (e.g. no permission)."""

    pid: int
    name: str
    memory_used: int | None
    kind: ProcessKind
    gpu_utilization: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "name": self.name,
            "memory_used": self.memory_used,
            "kind": self.kind.value,
            "gpu_utilization": self.gpu_utilization,
        }


@dataclass(frozen=True)
class MigInstance:
    """A MIG GPU instance and its (first) compute instance.

    `placement_start` is None when the driver does not tell it (NVML needs root for the GPU
    instance tables); `ci_id` is None for a GPU instance without a compute instance.
    """

    gi_id: int
    ci_id: int | None
    profile: str
    placement_start: int | None
    placement_size: int
    memory_total: int
    uuid: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "gi_id": self.gi_id,
            "ci_id": self.ci_id,
            "profile": self.profile,
            "placement": {"start": self.placement_start, "size": self.placement_size},
            "memory_total": self.memory_total,
            "uuid": self.uuid,
        }


@dataclass(frozen=True)
class MigState:
    """MIG mode now (`current`) and after the next GPU reset (`pending`), with the instances."""

    current: bool
    pending: bool
    instances: tuple[MigInstance, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "current": self.current,
            "pending": self.pending,
            "instances": [instance.to_json() for instance in self.instances],
        }


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one moment. Optional readings are None where the device does not give them."""

    index: int
    uuid: str
    name: str
    model: str
    pci_bus_id: str
    memory_total: int
    memory_used: int
    memory_free: int
    utilization: int | None
    temperature: int | None
    power_w: float | None
    mig: MigState | None
    processes: tuple[ProcessInfo, ...] = ()
    healthy: bool = True
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "model": self.model,
            "pci_bus_id": self.pci_bus_id,
            "memory_total": self.memory_total,
            "memory_used": self.memory_used,
            "memory_free": self.memory_free,
            "utilization": self.utilization,
            "temperature": self.temperature,
            "power_w": self.power_w,
            "mig": self.mig.to_json() if self.mig is not None else None,
            "processes": [process.to_json() for process in self.processes],
            "healthy": self.healthy,
            "error": self.error,
        }


@dataclass(frozen=True)
class NodeSnapshot:
    """All GPUs of a node at `timestamp` (Unix seconds); `simulated` is never hidden."""

    timestamp: float
    simulated: bool
    driver: str
    gpus: tuple[GpuSnapshot, ...]
    node_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The schema of `gpupool gpus --json`."""
        data: dict[str, Any] = {
            "timestamp": self.timestamp,
            "simulated": self.simulated,
            "driver": self.driver,
            "gpus": [gpu.to_json() for gpu in self.gpus],
        }
        if self.node_dir is not None:
            data["node_dir"] = self.node_dir
        return data
