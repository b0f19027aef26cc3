"""The node a share is launched on, read through the devices layer: real GPUs or a simulated node.

`gpupool exec` and `gpupool gpus` open a node the same way (`devices.factory.open_backend`), so
for one spec, `--node-dir` or $GPUPOOL_SIM_NODE both commands see the same simulated GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MemoryShare, format_bytes
from gpupool.devices.backend import GpuBackend
from gpupool.devices.factory import open_backend


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance a share can run on: its GPU, profile and memory."""

    uuid: str
    gpu: int
    profile: str
    gi_id: int
    memory_total: int

    @property
    def label(self) -> str:
        """`mig:1g.10gb@0/7`: profile, GPU index and GPU instance id, as `gpupool ps` shows it."""
        return mig_label(self.profile, self.gpu, self.gi_id)


def mig_label(profile: str, gpu: int, gi_id: int) -> str:
    """How a MIG instance is named to people: `mig:PROFILE@GPU/GI`."""
    return f"mig:{profile}@{gpu}/{gi_id}"


@dataclass(frozen=True)
class LaunchNode:
    """What a launch needs of a node: each GPU's model and memory, and where a simulated one is."""

    models: tuple[str, ...]
    #: None where the GPU did not say (a lost GPU): a memory share in % cannot resolve there
    memory_totals: tuple[int | None, ...]
    sim_node: Path | None = None
    #: the simulated node's spec as it was created (`2xH100`), None on real GPUs
    sim_spec: str | None = None
    #: each GPU's UUID (its compute arbiter's name)
    uuids: tuple[str, ...] = ()
    #: the MIG instances of the node's GPUs in MIG mode
    mig_devices: tuple[MigDevice, ...] = ()
    #: the GPUs in MIG mode: work runs on their instances, never on the whole GPU
    mig_gpus: frozenset[int] = frozenset()

    def check_whole_gpus(self, gpus: Sequence[int]) -> None:
        """Refuse a GPU in MIG mode as a whole GPU, naming its instances."""
        for index in gpus:
            if index in self.mig_gpus:
                mine = [d.uuid for d in self.mig_devices if d.gpu == index]
                have = f"its instances: {', '.join(mine)}" if mine else "it has no instance yet"
                raise InvalidRequest(
                    f"GPU {index} is in MIG mode: run on one of its instances with "
                    f"--gpu MIG-<uuid> ({have})"
                )

    def mig_device(self, uuid: str) -> MigDevice:
        """The instance of `uuid`; one line listing the node's instances when it has none such."""
        for device in self.mig_devices:
            if device.uuid == uuid:
                return device
        have = ", ".join(f"{d.uuid} ({d.label})" for d in self.mig_devices)
        raise InvalidRequest(
            f"no MIG instance {uuid} on this node; "
            + (f"its instances: {have}" if have else "it has none (see `gpupool mig show`)")
        )

    def totals_of(self, gpus: Sequence[int]) -> list[int | None]:
        """The memory of each GPU in `gpus`; an index the node lacks is one line naming it."""
        count = len(self.memory_totals)
        for index in gpus:
            if not 0 <= index < count:
                have = f"GPUs 0..{count - 1}" if count else "no GPU"
                raise InvalidRequest(f"invalid GPU index {index}: this node has {have}")
        return [self.memory_totals[i] for i in gpus]

    def check_memory_fits(self, gpus: Sequence[int], memory: MemoryShare | None) -> None:
        """Refuse, before anything runs, a memory share larger than one of `gpus`: the shim
        would only clamp it at the first CUDA call."""
        if memory is None or memory.bytes is None:
            return  # a fraction is at most the whole GPU
        for index, total in zip(gpus, self.totals_of(gpus), strict=True):
            if total is not None and memory.bytes > total:
                raise InvalidRequest(
                    f"memory share {format_bytes(memory.bytes)} ({memory.bytes} bytes) is larger "
                    f"than GPU {index} ({self.models[index]}, {format_bytes(total)})"
                )


def launch_node(backend: GpuBackend) -> LaunchNode:
    """The GPUs of `backend` now, from one snapshot."""
    snapshot = backend.snapshot()
    models = tuple(g.model for g in snapshot.gpus)
    # a broken GPU reports what it gave before failing, possibly 0: unknown, never a 0-byte limit
    totals = tuple(
        g.memory_total if g.healthy and g.memory_total > 0 else None for g in snapshot.gpus
    )
    uuids = tuple(g.uuid for g in snapshot.gpus)
    mig = tuple(
        MigDevice(i.uuid, g.index, i.profile, i.gi_id, i.memory_total)
        for g in snapshot.gpus
        if g.mig is not None and g.mig.current
        for i in g.mig.instances
        if i.uuid is not None
    )
    mig_gpus = frozenset(g.index for g in snapshot.gpus if g.mig is not None and g.mig.current)
    sim = backend.simulated_node()
    if sim is None:
        return LaunchNode(models, totals, uuids=uuids, mig_devices=mig, mig_gpus=mig_gpus)
    return LaunchNode(
        models, totals, sim.directory, sim.spec, uuids=uuids, mig_devices=mig, mig_gpus=mig_gpus
    )


def open_launch_node(simulate: str | None, node_dir: Path | None = None) -> LaunchNode:
    """The node `gpupool gpus` would show for the same arguments (NVML when none is simulated).

    No NVIDIA driver and no simulated node: DriverNotFound, whose line says how to fix it.
    """
    with open_backend(simulate, node_dir) as backend:
        return launch_node(backend)
