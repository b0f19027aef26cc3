"""The one interface to a node's GPUs. Its two implementations (`nvml`, `simulated`) import this
module and never each other; `devices.factory.open_backend` picks one."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from gpupool.devices.snapshot import MigInstance, NodeSnapshot


@dataclass(frozen=True)
class DriverProfile:
    """One MIG GPU instance profile as the driver (or the simulated node) describes it."""

    profile_id: int
    name: str
    memory_mib: int
    slice_count: int
    sm_count: int
    instance_count: int
    placements: tuple[tuple[int, int], ...]  # (start, size) pairs the driver allows


@dataclass(frozen=True)
class SimulatedNode:
    """Where a simulated node lives, which a launch hands to the simulated driver."""

    directory: Path
    #: the spec the node was created from (`2xH100`)
    spec: str


class GpuBackend(abc.ABC):
    """What gpupool needs from a node's GPUs: snapshots and MIG control.

    Errors are gpupool's own (`DeviceError` and children, `InvalidRequest` for a bad profile or
    placement); the cause from the driver is chained.
    """

    #: True for a simulated node; callers announce it, never hide it
    simulated: bool = False

    def simulated_node(self) -> SimulatedNode | None:
        """The simulated node behind this backend; None on real GPUs."""
        return None

    def prime(self) -> None:  # noqa: B027  a no-op unless a backend measures for itself
        """Start measuring now, so that the first snapshot's utilisation can cover the time
        until it is taken instead of waiting for a window of its own (a no-op where the driver
        keeps its own running average, as NVML does)."""

    @abc.abstractmethod
    def snapshot(self) -> NodeSnapshot:
        """All GPUs now."""

    @abc.abstractmethod
    def set_mig_mode(self, index: int, enabled: bool, *, force: bool = False) -> None:
        """Ask for MIG mode on or off. Refused while processes run on the GPU unless `force`.

        On real GPUs the change may stay pending until the GPU is reset: the next snapshot's
        `mig.pending` tells the truth.
        """

    @abc.abstractmethod
    def create_gpu_instance(self, index: int, profile_name: str, start: int) -> MigInstance:
        """Create a GPU instance of `profile_name` at placement `start`, with a full-size CI."""

    @abc.abstractmethod
    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy GPU instance `gi_id` and its compute instances."""

    @abc.abstractmethod
    def mig_profile_table(self, index: int) -> list[DriverProfile]:
        """The GPU instance profiles the driver offers on GPU `index` (empty without MIG)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the driver or the mapped state."""

    def __enter__(self) -> GpuBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
