"""The simulated backend: a simulated node's GPUs, read from the state the simulated driver keeps.

Utilisation is busy time over wall time between two samples of the driver's cumulative busy
counters; the backend keeps the last sample, and a first snapshot samples twice (50 ms apart).
Temperature and power are a simple model of utilisation (idle to board power): simulated, and
the snapshot says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import DeviceError
from gpupool.core.units import MiB
from gpupool.devices.backend import DriverProfile, GpuBackend, SimulatedNode
from gpupool.devices.procfs import process_name
from gpupool.devices.sim.node import SimGpu, SimInstance, SimNode
from gpupool.devices.sim.spec import parse_spec, resolve_node_dir
from gpupool.devices.sim.state import (
    FLAG_NOT_SUPPORTED,
    PROC_BOTH,
    PROC_GRAPHICS,
    SimGpuCounters,
    SimProcSlot,
    is_slot_alive,
    parent_gpu,
)
from gpupool.devices.snapshot import (
    GpuSnapshot,
    MigInstance,
    MigState,
    NodeSnapshot,
    ProcessInfo,
    ProcessKind,
)

DRIVER = "simulated"
#: a slot's kind as NVML would list the process (any other value is the driver's own: compute)
_KINDS = {PROC_GRAPHICS: ProcessKind.GRAPHICS, PROC_BOTH: ProcessKind.BOTH}
FIRST_SAMPLE_GAP_S = 0.05
#: board power (W) of each model, the top of the simulated power model
_BOARD_POWER_W = {
    "A30-24GB": 165.0,
    "A100-40GB": 400.0,
    "A100-80GB": 400.0,
    "H100-80GB": 700.0,
    "H100-94GB": 400.0,
    "H200-141GB": 700.0,
    "B200-180GB": 1000.0,
}
_IDLE_POWER_SHARE = 0.12
_IDLE_TEMPERATURE_C = 32
_FULL_LOAD_RISE_C = 40


@dataclass(frozen=True)
class _Sample:
    """The driver's counters at one moment."""

    at_ns: int
    gpus: tuple[SimGpuCounters, ...]
    live: tuple[SimProcSlot, ...]
    dead: tuple[SimProcSlot, ...]


def _proc_key(slot: SimProcSlot) -> tuple[int, int, int]:
    return (slot.pid, slot.start_time, slot.gpu)


def _percent(busy_ns: int, wall_ns: int) -> int:
    return max(0, min(100, round(100 * busy_ns / wall_ns))) if wall_ns > 0 else 0


class SimulatedBackend(GpuBackend):
    """A simulated node directory as a GpuBackend."""

    simulated = True

    def __init__(self, node: SimNode) -> None:
        self.node = node
        #: CLOCK_MONOTONIC ns, the simulated driver's clock; replaceable to test the arithmetic
        self.clock: Callable[[], int] = time.monotonic_ns
        self._last: _Sample | None = None

    @classmethod
    def open(cls, spec: str | None, node_dir: Path | None = None) -> SimulatedBackend:
        """The node of `spec` (created when new) in `node_dir`, $GPUPOOL_SIM_NODE or the default."""
        parsed = parse_spec(spec) if spec is not None else None
        directory = resolve_node_dir(parsed, node_dir)
        if directory is None:
            raise DeviceError("no simulated node given: use --simulate SPEC or --node-dir DIR")
        return cls(SimNode.open_or_create(parsed, directory))

    @property
    def node_dir(self) -> Path:
        return self.node.directory

    def simulated_node(self) -> SimulatedNode:
        return SimulatedNode(self.node.directory, self.node.spec_text)

    def close(self) -> None:
        self.node.close()

    def _sample(self) -> _Sample:
        state = self.node.state
        at_ns = self.clock()
        alive = {slot: is_slot_alive(slot) for slot in state.procs(live_only=False)}
        live = tuple(slot for slot, ok in alive.items() if ok)
        dead = tuple(slot for slot, ok in alive.items() if not ok)
        return _Sample(at_ns, tuple(state.gpus()), live, dead)

    def prime(self) -> None:
        if self._last is None:
            self._last = self._sample()

    def snapshot(self) -> NodeSnapshot:
        self.prime()
        assert self._last is not None
        # utilisation over less than a window of kernels would be noise: wait out the rest
        since = (self.clock() - self._last.at_ns) / 1e9
        if since < FIRST_SAMPLE_GAP_S:
            time.sleep(FIRST_SAMPLE_GAP_S - since)
        previous, now = self._last, self._sample()
        self._last = now
        gpus = tuple(
            self._gpu(gpu, counters, previous, now)
            for gpu, counters in zip(self.node.gpus(), now.gpus, strict=True)
        )
        return NodeSnapshot(
            timestamp=time.time(),
            simulated=True,
            driver=DRIVER,
            gpus=gpus,
            node_dir=str(self.node.directory),
        )

    def _gpu(
        self, gpu: SimGpu, counters: SimGpuCounters, previous: _Sample, now: _Sample
    ) -> GpuSnapshot:
        if counters.lost:
            return GpuSnapshot(
                index=gpu.index,
                uuid=counters.uuid,
                name=counters.name,
                model=counters.model,
                pci_bus_id=counters.pci_bus_id,
                memory_total=counters.memory_total,
                memory_used=0,
                memory_free=0,
                utilization=None,
                temperature=None,
                power_w=None,
                mig=None,
                healthy=False,
                error="GPU is lost (simulated)",
            )
        wall_ns = now.at_ns - previous.at_ns
        utilization = self._gpu_utilization(counters, previous, now)
        supported = not counters.flags & FLAG_NOT_SUPPORTED
        used = self._memory_used(counters.index, now)
        return GpuSnapshot(
            index=gpu.index,
            uuid=counters.uuid,
            name=counters.name,
            model=counters.model,
            pci_bus_id=counters.pci_bus_id,
            memory_total=counters.memory_total,
            memory_used=used,
            memory_free=max(0, counters.memory_total - used),
            utilization=utilization if supported else None,
            temperature=_temperature(utilization) if supported else None,
            power_w=_power(counters.model, utilization) if supported else None,
            mig=_mig_state(gpu),
            processes=self._processes(counters.index, previous, now, wall_ns, supported),
        )

    @staticmethod
    def _gpu_utilization(counters: SimGpuCounters, previous: _Sample, now: _Sample) -> int:
        before = previous.gpus[counters.index].busy_ns_total
        busy = counters.busy_ns_total - before
        if busy == 0 and counters.busy_until_ns > now.at_ns:
            return 100  # one long kernel, accounted before this window, still runs
        return _percent(busy, now.at_ns - previous.at_ns)

    @staticmethod
    def _memory_used(index: int, now: _Sample) -> int:
        # What live processes hold, not the driver's GPU counter: the counter keeps a SIGKILLed
        # process's memory until a driver call reclaims its slot, and it is read without the
        # driver's lock, so it may be caught mid-update (or left so by a process killed there).
        return sum(s.memory_used for s in now.live if parent_gpu(s.gpu) == index)

    @staticmethod
    def _processes(
        index: int, previous: _Sample, now: _Sample, wall_ns: int, supported: bool
    ) -> tuple[ProcessInfo, ...]:
        before = {_proc_key(s): s.busy_ns for s in previous.live}
        processes = []
        # a process on one of the GPU's MIG instances is the GPU's process too, as NVML lists it
        on_gpu = (s for s in now.live if parent_gpu(s.gpu) == index)
        for slot in sorted(on_gpu, key=lambda s: s.pid):
            # a process new in this window has no baseline yet: it shows from the next sample
            busy = slot.busy_ns - before.get(_proc_key(slot), slot.busy_ns)
            share = _percent(busy, wall_ns) if supported else None
            kind = _KINDS.get(slot.kind, ProcessKind.COMPUTE)
            processes.append(
                ProcessInfo(slot.pid, process_name(slot.pid), slot.memory_used, kind, share)
            )
        return tuple(processes)

    # -- MIG ------------------------------------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool, *, force: bool = False) -> None:
        if not force:
            pids = sorted({s.pid for s in self._sample().live if parent_gpu(s.gpu) == index})
            if pids:
                raise DeviceError(
                    f"GPU {index} runs processes ({', '.join(map(str, pids))}): stop them or "
                    "use --force to change its MIG mode"
                )
        self.node.set_mig(index, enabled)

    def create_gpu_instance(self, index: int, profile_name: str, start: int) -> MigInstance:
        created = self.node.create_instance(index, profile_name, start)
        model = self.node.gpu(index).catalog_model
        return _mig_instance(created, model.profile(created.profile).memory_bytes)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self.node.destroy_instance(index, gi_id)

    def mig_profile_table(self, index: int) -> list[DriverProfile]:
        model = self.node.gpu(index).catalog_model
        return [
            DriverProfile(
                profile_id=p.smi_id,
                name=p.name,
                memory_mib=p.memory_bytes // MiB,
                slice_count=p.compute_slices,
                sm_count=p.sm_count,
                instance_count=p.max_instances,
                placements=tuple((start, p.size) for start in p.starts),
            )
            for p in model.profiles
        ]


def _mig_instance(instance: SimInstance, memory_total: int) -> MigInstance:
    return MigInstance(
        gi_id=instance.gi_id,
        ci_id=instance.ci_id,
        profile=instance.profile,
        placement_start=instance.start,
        placement_size=instance.size,
        memory_total=memory_total,
        uuid=instance.uuid,
    )


def _mig_state(gpu: SimGpu) -> MigState:
    model = gpu.catalog_model
    return MigState(
        current=gpu.mig,
        pending=gpu.mig,  # a simulated GPU applies a MIG mode change at once
        instances=tuple(
            _mig_instance(i, model.profile(i.profile).memory_bytes) for i in gpu.instances
        ),
    )


def _temperature(utilization: int) -> int:
    return _IDLE_TEMPERATURE_C + _FULL_LOAD_RISE_C * utilization // 100


def _power(model: str, utilization: int) -> float:
    board = _BOARD_POWER_W.get(model, 300.0)
    idle = board * _IDLE_POWER_SHARE
    return round(idle + (board - idle) * utilization / 100, 1)
