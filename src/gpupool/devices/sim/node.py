"""A simulated node directory: `node.json` (inventory and MIG layout) next to `state.bin`.

`node.json` is replaced atomically (write, then rename) under an flock on `node.lock`, so readers
never lock and two writers never lose each other's change. Its format (1)::

    {"format": 1, "spec": "2xA30", "key": "<spec hash>",
     "gpus": [{"index": 0, "model": "A30-24GB", "uuid": "GPU-...", "pci_bus_id": "00000000:18:00.0",
               "mig": true, "instances": [{"gi_id": 1, "ci_id": 0, "profile": "2g.12gb",
                                           "start": 0, "size": 2, "uuid": "MIG-..."}]}]}

MIG changes follow the hardware's rules, from the catalog: valid start slots, no overlapping
memory slices, at most `max_instances` of a profile (the catalog's start slots keep compute
slices within the GPU's, as the driver's tables do).
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.core.errors import ConfigError, DeviceError, InvalidRequest
from gpupool.devices.sim.node_files import (
    NODE_FILE,
    NODE_FORMAT,
    locked,
    read_node_file,
)
from gpupool.devices.sim.spec import GpuEntry, NodeSpec, host_link
from gpupool.devices.sim.state import (
    MIG_PER_GPU,
    STATE_FILE,
    SimGpuSpec,
    SimInstanceSpec,
    SimState,
    mig_device_number,
)
from gpupool.mig import catalog, planner
from gpupool.mig.planner import Placement

_UUID_NAMESPACE = uuidlib.UUID("5f8a1c2e-4b7d-4e0a-9c3f-6d2b1a0e7f48")


@dataclass(frozen=True)
class SimInstance:
    """A MIG instance of a simulated GPU (one GPU instance with one full compute instance)."""

    gi_id: int
    ci_id: int
    profile: str
    start: int
    size: int
    uuid: str

    def to_json(self) -> dict[str, Any]:
        return {
            "gi_id": self.gi_id,
            "ci_id": self.ci_id,
            "profile": self.profile,
            "start": self.start,
            "size": self.size,
            "uuid": self.uuid,
        }


@dataclass(frozen=True)
class SimGpu:
    """A simulated GPU's inventory and MIG layout as node.json holds it."""

    index: int
    model: str
    uuid: str
    pci_bus_id: str
    mig: bool
    instances: tuple[SimInstance, ...]

    @property
    def catalog_model(self) -> catalog.GpuModel:
        return catalog.get_model(self.model)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "model": self.model,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "mig": self.mig,
            "instances": [i.to_json() for i in self.instances],
        }


def _gpu_from_json(data: dict[str, Any]) -> SimGpu:
    return SimGpu(
        index=int(data["index"]),
        model=str(data["model"]),
        uuid=str(data["uuid"]),
        pci_bus_id=str(data["pci_bus_id"]),
        mig=bool(data["mig"]),
        instances=tuple(SimInstance(**i) for i in data["instances"]),
    )


def _pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


def _new_gpus(spec: NodeSpec) -> list[SimGpu]:
    gpus = []
    for index, entry in enumerate(spec.gpus):
        gpu_uuid = entry.uuid or f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{spec.key}/{index}')}"
        gpus.append(SimGpu(index, entry.model.name, gpu_uuid, _pci_bus_id(index), False, ()))
    return gpus


class SimNode:
    """An open simulated node directory."""

    def __init__(self, directory: Path, key: str, spec_text: str, state: SimState) -> None:
        self.directory = directory
        self.key = key
        self.spec_text = spec_text
        self.state = state

    @property
    def node_file(self) -> Path:
        return self.directory / NODE_FILE

    @classmethod
    def open_or_create(cls, spec: NodeSpec | None, directory: Path) -> SimNode:
        """The node in `directory`; created from `spec` when absent, checked against it if not."""
        with locked(directory, create=spec is not None) as held:
            node_file = directory / NODE_FILE
            if not node_file.exists():
                if spec is None:
                    raise DeviceError(
                        f"no simulated node in {directory}: create one with --simulate SPEC "
                        "(e.g. --simulate 2xA30)"
                    )
                return cls._create(spec, directory)
            data = read_node_file(node_file)
            if spec is not None and data["key"] != spec.key:
                raise DeviceError(
                    f"{directory} holds another simulated node ({data['spec']}), not {spec.text}: "
                    "use another --node-dir or remove it"
                )
            state_path = directory / STATE_FILE
            if not state_path.exists() or SimState.is_outdated(state_path):
                if not held:
                    raise DeviceError(f"{state_path} is missing or outdated: ask its owner")
                # node.json survived a cleanup of the runtime state, or an earlier gpupool made
                # the state in an older layout: start the counters afresh
                SimState.create(state_path, _state_specs(_gpus_of(data))).close()
            node = cls(directory, data["key"], data["spec"], SimState.open(state_path))
            if held:  # another user's node is only looked at
                node._sync_instances(_gpus_of(data))
            return node

    @classmethod
    def _create(cls, spec: NodeSpec, directory: Path) -> SimNode:
        gpus = []
        for gpu, entry in zip(_new_gpus(spec), spec.gpus, strict=True):
            try:
                gpus.append(_with_spec_mig(gpu, entry))
            except (InvalidRequest, DeviceError) as err:
                raise ConfigError(f"{spec.text}: GPU {gpu.index}: {err}") from err
        state = SimState.create(directory / STATE_FILE, _state_specs(gpus))
        node = cls(directory, spec.key, spec.text, state)
        node._write(gpus)
        node._sync_instances(gpus)
        return node

    def close(self) -> None:
        self.state.close()

    # -- node.json --------------------------------------------------------------------------------

    def gpus(self) -> list[SimGpu]:
        return _gpus_of(read_node_file(self.node_file))

    def gpu(self, index: int) -> SimGpu:
        gpus = self.gpus()
        if not 0 <= index < len(gpus):
            raise InvalidRequest(f"simulated GPU {index} does not exist (0..{len(gpus) - 1})")
        return gpus[index]

    def _write(self, gpus: list[SimGpu]) -> None:
        data = {
            "format": NODE_FORMAT,
            "spec": self.spec_text,
            "key": self.key,
            "gpus": [g.to_json() for g in gpus],
        }
        tmp = self.node_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.node_file)  # readers see the old or the new file, never half

    def _update(self, index: int, change: Any) -> Any:
        """Apply `change(gpu) -> (new gpu, result)` to GPU `index` under the node lock."""
        with locked(self.directory, create=False) as held:
            if not held:
                raise DeviceError(f"the simulated node in {self.directory} is another user's")
            gpus = self.gpus()
            if not 0 <= index < len(gpus):
                raise InvalidRequest(f"simulated GPU {index} does not exist (0..{len(gpus) - 1})")
            if self.state.gpu(index).lost:
                raise DeviceError(f"GPU {index} is lost (simulated): it does not answer")
            gpus[index], result = change(gpus[index])
            self._write(gpus)
            self._sync_instances(gpus[index : index + 1])
            return result

    def _sync_instances(self, gpus: list[SimGpu]) -> None:
        """Give the simulated driver the MIG instances of `gpus` (state.bin's instance records):
        it offers each as a device with the instance's memory and SMs."""
        for gpu in gpus:
            model = gpu.catalog_model
            specs = []
            for instance in gpu.instances:
                profile = model.profile(instance.profile)
                name = f"{model.marketing_name} MIG {profile.name}"
                specs.append(
                    SimInstanceSpec(
                        instance.gi_id,
                        instance.uuid,
                        name,
                        profile.memory_bytes,
                        profile.sm_count,
                    )
                )
            self.state.set_instances(gpu.index, specs)

    # -- MIG, with the hardware's rules ----------------------------------------------------------

    def set_mig(self, index: int, enabled: bool) -> None:
        self._update(index, lambda gpu: (_with_mig(gpu, enabled), None))

    def create_instance(self, index: int, profile_name: str, start: int) -> SimInstance:
        result: SimInstance = self._update(
            index, lambda gpu: _with_instance(gpu, profile_name, start)
        )
        return result

    def destroy_instance(self, index: int, gi_id: int) -> None:
        if 1 <= gi_id <= MIG_PER_GPU:
            device = mig_device_number(index, gi_id)
            pids = sorted({s.pid for s in self.state.procs() if s.gpu == device})
            if pids:
                # as the driver answers NVML_ERROR_IN_USE
                raise DeviceError(
                    f"GPU {index}'s GPU instance {gi_id} is in use by processes "
                    f"{', '.join(map(str, pids))}: stop them first"
                )
        self._update(index, lambda gpu: (_without_instance(gpu, gi_id), None))


def _with_spec_mig(gpu: SimGpu, entry: GpuEntry) -> SimGpu:
    """A new GPU with the MIG mode and instances its spec entry asks for."""
    if not entry.mig:
        return gpu
    gpu = _with_mig(gpu, True)
    fixed = [Placement(r.start, r.profile) for r in entry.instances if r.start is not None]
    counts = Counter(r.profile for r in entry.instances if r.start is None)
    # the planner `mig check` uses, so a layout it accepts is one the node takes, in any order
    for placement in planner.find_placements(entry.model, counts, fixed):
        gpu, _ = _with_instance(gpu, placement.profile, placement.start)
    return gpu


def _with_mig(gpu: SimGpu, enabled: bool) -> SimGpu:
    if not enabled and gpu.instances:
        ids = ", ".join(str(i.gi_id) for i in gpu.instances)
        raise DeviceError(
            f"GPU {gpu.index} still has MIG instances (GPU instances {ids}): destroy them "
            "before disabling MIG mode"
        )
    return SimGpu(gpu.index, gpu.model, gpu.uuid, gpu.pci_bus_id, enabled, gpu.instances)


def _with_instance(gpu: SimGpu, profile_name: str, start: int) -> tuple[SimGpu, SimInstance]:
    instance = _new_instance(gpu, profile_name, start)
    instances = tuple(sorted((*gpu.instances, instance), key=lambda i: i.start))
    return SimGpu(gpu.index, gpu.model, gpu.uuid, gpu.pci_bus_id, True, instances), instance


def _without_instance(gpu: SimGpu, gi_id: int) -> SimGpu:
    kept = tuple(i for i in gpu.instances if i.gi_id != gi_id)
    if len(kept) == len(gpu.instances):
        have = ", ".join(str(i.gi_id) for i in gpu.instances) or "none"
        raise InvalidRequest(
            f"GPU {gpu.index} has no GPU instance {gi_id} (its GPU instances: {have})"
        )
    return SimGpu(gpu.index, gpu.model, gpu.uuid, gpu.pci_bus_id, gpu.mig, kept)


def _new_instance(gpu: SimGpu, profile_name: str, start: int) -> SimInstance:
    """Check a new instance against the hardware rules; the instance when it may be created."""
    if not gpu.mig:
        raise DeviceError(f"GPU {gpu.index} is not in MIG mode: enable MIG first")
    profile = gpu.catalog_model.profile(profile_name)
    if start not in profile.starts:
        valid = ", ".join(map(str, profile.starts))
        raise InvalidRequest(
            f"{profile.name} cannot start at slot {start} on GPU {gpu.index} ({gpu.model}); "
            f"valid starts: {valid}"
        )
    same = [i for i in gpu.instances if i.profile == profile.name]
    if len(same) >= profile.max_instances:
        raise InvalidRequest(
            f"GPU {gpu.index} ({gpu.model}) already has {len(same)} {profile.name} instances, "
            f"the most it allows"
        )
    conflict = _overlap(gpu, profile, start)
    if conflict is not None:
        raise InvalidRequest(
            f"{profile.name} at {_slots(start, profile.size)} on GPU {gpu.index} overlaps "
            f"{conflict.profile} (GPU instance {conflict.gi_id}) at "
            f"{_slots(conflict.start, conflict.size)}"
        )
    used = {i.gi_id for i in gpu.instances}
    gi_id = next(n for n in range(1, len(used) + 2) if n not in used)
    return SimInstance(gi_id, 0, profile.name, start, profile.size, f"MIG-{uuidlib.uuid4()}")


def _overlap(gpu: SimGpu, profile: catalog.MigProfile, start: int) -> SimInstance | None:
    wanted = set(profile.slots(start))
    for instance in gpu.instances:
        if wanted & set(range(instance.start, instance.start + instance.size)):
            return instance
    return None


def _slots(start: int, size: int) -> str:
    return f"slot {start}" if size == 1 else f"slots {start}-{start + size - 1}"


def _gpus_of(data: dict[str, Any]) -> list[SimGpu]:
    return [_gpu_from_json(g) for g in data["gpus"]]


def _state_specs(gpus: list[SimGpu]) -> list[SimGpuSpec]:
    specs = []
    for gpu in gpus:
        model = gpu.catalog_model
        specs.append(
            SimGpuSpec(
                uuid=gpu.uuid,
                name=model.marketing_name,
                model=model.name,
                memory_total=model.memory_bytes,
                sm_count=model.sm_count,
                cc_major=model.compute_capability[0],
                cc_minor=model.compute_capability[1],
                pci_bus_id=gpu.pci_bus_id,
                host_link_bytes_s=host_link(model.name).bytes_per_s,
            )
        )
    return specs
