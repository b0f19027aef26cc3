"""The NVML backend: real GPUs read and controlled through the `Nvml` choke point."""

from __future__ import annotations

import ctypes
import re
import time
from dataclasses import dataclass
from typing import Any

from gpupool.core.errors import DeviceError, InvalidRequest, NotAvailable
from gpupool.core.units import MiB
from gpupool.devices.backend import DriverProfile, GpuBackend
from gpupool.devices.nvml_lib import NOT_AVAILABLE, Nvml, text
from gpupool.devices.procfs import process_name
from gpupool.devices.snapshot import (
    GpuSnapshot,
    MigInstance,
    MigState,
    NodeSnapshot,
    ProcessInfo,
    ProcessKind,
)
from gpupool.mig import catalog

#: placements per profile never exceed the slice count (8 on every MIG GPU); room to spare
_MAX_PLACEMENTS = 16
_GPU_FAMILIES = ("A30", "A100", "H100", "H200", "B200")
_MIG_NAME = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)")


def model_of(name: str, memory_total: int, pci_device_id: int | None = None) -> str:
    """gpupool's model name for an NVML GPU (`NVIDIA H100 80GB HBM3` -> H100-80GB).

    By PCI device id, then by marketing name, then by family and nearest memory size; a GPU
    outside the catalog keeps its marketing name.
    """
    model = catalog.find_model_by_pci_device_id(pci_device_id) if pci_device_id else None
    model = model or catalog.find_model_by_device_name(name)
    if model is not None:
        return model.name
    family = next((f for f in _GPU_FAMILIES if re.search(rf"\b{f}\b", name)), None)
    candidates = [m for m in catalog.MODELS if family and m.name.startswith(f"{family}-")]
    if not candidates:
        return name.removeprefix("NVIDIA ").strip()
    return min(candidates, key=lambda m: abs(m.memory_bytes - memory_total)).name


def _ci_profile_constant(slices: int) -> str:
    """The compute-instance profile that spans a whole GPU instance of `slices` slices."""
    return f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE"


@dataclass
class _GpuReadings:
    """What one snapshot learnt of a GPU before something failed."""

    index: int
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    pci_device_id: int | None = None
    memory: tuple[int, int, int] = (0, 0, 0)


class NvmlBackend(GpuBackend):
    """Real GPUs through NVML. `nvml` is injectable so tests can run it on a scenario fake."""

    simulated = False

    def __init__(self, nvml: Nvml | None = None) -> None:
        self._nvml = nvml if nvml is not None else Nvml()
        self._last_process_sample: dict[int, int] = {}  # GPU index -> NVML timestamp (us)
        self._profiles: dict[int, list[DriverProfile]] = {}
        self._nvml.init()

    def close(self) -> None:
        self._nvml.shutdown()

    def _handle(self, index: int) -> Any:
        return self._nvml.command("nvmlDeviceGetHandleByIndex", index, what=f"opening GPU {index}")

    # -- snapshots ------------------------------------------------------------------------------

    def snapshot(self) -> NodeSnapshot:
        nvml = self._nvml
        driver = nvml.query("nvmlSystemGetDriverVersion")
        count = nvml.command("nvmlDeviceGetCount", what="counting GPUs")
        gpus = tuple(self._gpu(index) for index in range(count))
        return NodeSnapshot(
            timestamp=time.time(),
            simulated=False,
            driver=text(driver) if driver is not NOT_AVAILABLE else "unknown",
            gpus=gpus,
        )

    def _gpu(self, index: int) -> GpuSnapshot:
        seen = _GpuReadings(index)
        try:
            handle = self._handle(index)
            self._read_identity(handle, seen)
            return self._read_gpu(handle, seen)
        except DeviceError as err:  # GpuLost included: this GPU is broken, the others answer
            return self._broken(seen, str(err))

    def _broken(self, seen: _GpuReadings, error: str) -> GpuSnapshot:
        total, used, free = seen.memory
        return GpuSnapshot(
            index=seen.index,
            uuid=seen.uuid,
            name=seen.name,
            model=model_of(seen.name, total, seen.pci_device_id) if seen.name else "",
            pci_bus_id=seen.pci_bus_id,
            memory_total=total,
            memory_used=used,
            memory_free=free,
            utilization=None,
            temperature=None,
            power_w=None,
            mig=None,
            healthy=False,
            error=error,
        )

    def _read_identity(self, handle: Any, seen: _GpuReadings) -> None:
        nvml = self._nvml
        seen.uuid = text(nvml.command("nvmlDeviceGetUUID", handle, what="reading the GPU UUID"))
        seen.name = text(nvml.command("nvmlDeviceGetName", handle, what="reading the GPU name"))
        pci = nvml.query(("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"), handle)
        if pci is not NOT_AVAILABLE:
            seen.pci_bus_id = text(pci.busId)
            seen.pci_device_id = int(pci.pciDeviceId)
        memory = self._memory(handle)
        seen.memory = (memory.total, memory.used, memory.free)

    def _memory(self, handle: Any) -> Any:
        nvml = self._nvml
        version = nvml.constant("nvmlMemory_v2")
        if version is not None:
            # v2 reports reserved memory apart, so `used` is what processes hold
            memory = nvml.query(
                "nvmlDeviceGetMemoryInfo",
                handle,
                version=version,
                absent=("NVML_ERROR_INVALID_ARGUMENT",),  # a driver that predates v2
            )
            if memory is not NOT_AVAILABLE:
                return memory
        return nvml.command("nvmlDeviceGetMemoryInfo", handle, what="reading GPU memory")

    def _read_gpu(self, handle: Any, seen: _GpuReadings) -> GpuSnapshot:
        nvml = self._nvml
        rates = nvml.query("nvmlDeviceGetUtilizationRates", handle)
        temperature = nvml.query(
            "nvmlDeviceGetTemperature", handle, nvml.constant("NVML_TEMPERATURE_GPU", 0)
        )
        power_mw = nvml.query("nvmlDeviceGetPowerUsage", handle)
        total, used, free = seen.memory
        return GpuSnapshot(
            index=seen.index,
            uuid=seen.uuid,
            name=seen.name,
            model=model_of(seen.name, total, seen.pci_device_id),
            pci_bus_id=seen.pci_bus_id,
            memory_total=total,
            memory_used=used,
            memory_free=free,
            utilization=int(rates.gpu) if rates is not NOT_AVAILABLE else None,
            temperature=int(temperature) if temperature is not NOT_AVAILABLE else None,
            power_w=power_mw / 1000.0 if power_mw is not NOT_AVAILABLE else None,
            mig=self._mig_state(seen.index, handle),
            processes=self._processes(seen.index, handle),
        )

    def _processes(self, index: int, handle: Any) -> tuple[ProcessInfo, ...]:
        nvml = self._nvml
        memory: dict[int, int | None] = {}
        listed_in: dict[str, set[int]] = {}
        compute_known = True
        for kind in ("Compute", "Graphics"):
            base = f"nvmlDeviceGet{kind}RunningProcesses"
            listed = nvml.query((f"{base}_v3", f"{base}_v2", base), handle)
            listed_in[kind] = set()
            if listed is NOT_AVAILABLE and kind == "Compute":
                compute_known = False
            for proc in [] if listed is NOT_AVAILABLE else listed:
                used = proc.usedGpuMemory
                # a process doing compute and graphics appears twice: keep the larger figure
                previous = memory.get(proc.pid)
                memory[proc.pid] = used if previous is None else max(previous, used or 0)
                listed_in[kind].add(proc.pid)
        utilization = self._process_utilization(index, handle)
        return tuple(
            ProcessInfo(
                pid,
                process_name(pid),
                used,
                # without the compute list, a graphics process may hold a CUDA context too:
                # only the driver's word makes a process graphics only (never killed)
                ProcessKind.of(
                    pid in listed_in["Compute"] or not compute_known, pid in listed_in["Graphics"]
                ),
                utilization.get(pid),
            )
            for pid, used in sorted(memory.items())
        )

    def _process_utilization(self, index: int, handle: Any) -> dict[int, int]:
        """SM utilisation per pid since the previous snapshot (NVML keeps a sample buffer)."""
        samples = self._nvml.query(
            "nvmlDeviceGetProcessUtilization",
            handle,
            self._last_process_sample.get(index, 0),
            absent=("NVML_ERROR_NOT_FOUND",),  # no sample since the timestamp
        )
        if samples is NOT_AVAILABLE:
            return {}
        result: dict[int, int] = {}
        for sample in samples:
            result[sample.pid] = max(result.get(sample.pid, 0), int(sample.smUtil))
            latest = max(self._last_process_sample.get(index, 0), int(sample.timeStamp))
            self._last_process_sample[index] = latest
        return result

    # -- MIG ------------------------------------------------------------------------------------

    def _mig_state(self, index: int, handle: Any) -> MigState | None:
        modes = self._nvml.query("nvmlDeviceGetMigMode", handle)
        if modes is NOT_AVAILABLE:
            return None
        current, pending = bool(modes[0]), bool(modes[1])
        instances = self._mig_instances(index, handle) if current else ()
        return MigState(current=current, pending=pending, instances=instances)

    def _mig_devices(self, handle: Any) -> dict[int, tuple[int, str, int, str]]:
        """gi_id -> (ci_id, uuid, memory_total, name) of the MIG devices (needs no root)."""
        nvml = self._nvml
        count = nvml.query("nvmlDeviceGetMaxMigDeviceCount", handle)
        found: dict[int, tuple[int, str, int, str]] = {}
        for slot in range(0 if count is NOT_AVAILABLE else count):
            mig = nvml.query(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                handle,
                slot,
                absent=("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"),
            )
            if mig is NOT_AVAILABLE:
                continue
            gi_id = nvml.query("nvmlDeviceGetGpuInstanceId", mig)
            ci_id = nvml.query("nvmlDeviceGetComputeInstanceId", mig)
            uuid = nvml.query("nvmlDeviceGetUUID", mig)
            name = nvml.query("nvmlDeviceGetName", mig)
            memory = nvml.query("nvmlDeviceGetMemoryInfo", mig)
            if any(v is NOT_AVAILABLE for v in (gi_id, ci_id, uuid, memory)):
                continue  # a MIG device the driver half-describes is left out, not fatal
            name_text = text(name) if name is not NOT_AVAILABLE else ""
            found.setdefault(gi_id, (ci_id, text(uuid), int(memory.total), name_text))
        return found

    def _mig_instances(self, index: int, handle: Any) -> tuple[MigInstance, ...]:
        devices = self._mig_devices(handle)
        listed = self._gpu_instances(index, handle)
        if listed is None:  # no permission for the GPU instance tables: MIG devices alone
            return tuple(
                _instance_from_device(gi_id, *device) for gi_id, device in sorted(devices.items())
            )
        instances = []
        for gi_id, profile, start, size in sorted(listed, key=lambda row: row[0]):
            ci_id, uuid, memory_total, _ = devices.get(gi_id, (None, None, 0, ""))
            if not memory_total:
                memory_total = profile.memory_mib * MiB
            instances.append(
                MigInstance(gi_id, ci_id, profile.name, start, size, memory_total, uuid)
            )
        return tuple(instances)

    def _gpu_instances(
        self, index: int, handle: Any
    ) -> list[tuple[int, DriverProfile, int, int]] | None:
        """(gi_id, profile, start, size) of every GPU instance; None when not permitted."""
        nvml = self._nvml
        listed = []
        for profile in self.mig_profile_table(index):
            array, count = nvml.handle_array(
                "c_nvmlGpuInstance_t", max(profile.instance_count, _MAX_PLACEMENTS)
            )
            found = nvml.query(
                "nvmlDeviceGetGpuInstances", handle, profile.profile_id, array, count
            )
            if found is NOT_AVAILABLE:
                return None
            for gi in array[: count.contents.value]:
                info = nvml.command("nvmlGpuInstanceGetInfo", gi, what="reading a GPU instance")
                listed.append((info.id, profile, info.placement.start, info.placement.size))
        return listed

    def mig_profile_table(self, index: int) -> list[DriverProfile]:
        if index in self._profiles:
            return self._profiles[index]
        nvml = self._nvml
        handle = self._handle(index)
        table = []
        for number in range(nvml.constant("NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
            info = self._versioned_info("nvmlDeviceGetGpuInstanceProfileInfo", handle, number)
            if info is NOT_AVAILABLE:
                continue
            table.append(self._driver_profile(handle, info))
        if table:  # some drivers give the table only in MIG mode: ask again until they do
            self._profiles[index] = table
        return table

    def _versioned_info(self, function: str, *args: Any) -> Any:
        """A MIG profile info struct: the v2 call (it carries the profile name), else v1."""
        invalid = ("NVML_ERROR_INVALID_ARGUMENT",)  # a profile number this driver does not know
        info = self._nvml.query(function, *args, absent=invalid)
        if info is NOT_AVAILABLE:
            info = self._nvml.query(function, *args, version=1, absent=invalid)
        return info

    def _profile_name(self, handle: Any, info: Any) -> str:
        """The driver's name (`MIG 3g.40gb` in v2 structs), else the catalog's for this model."""
        name = text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
        if name:
            return name
        seen = _GpuReadings(-1)
        self._read_identity(handle, seen)
        model_name = model_of(seen.name, seen.memory[0], seen.pci_device_id)
        for model in catalog.MODELS:
            for profile in model.profiles if model.name == model_name else ():
                if profile.smi_id == info.id:
                    return profile.name
        return f"{info.sliceCount}g.{-(-info.memorySizeMB // 1024)}gb"  # NVIDIA's naming

    def _driver_profile(self, handle: Any, info: Any) -> DriverProfile:
        nvml = self._nvml
        array, count = nvml.handle_array("c_nvmlGpuInstancePlacement_t", _MAX_PLACEMENTS)
        found = nvml.query(
            "nvmlDeviceGetGpuInstancePossiblePlacements", handle, info.id, array, count
        )
        placements = (
            ()
            if found is NOT_AVAILABLE
            else tuple((p.start, p.size) for p in array[: count.contents.value])
        )
        return DriverProfile(
            profile_id=int(info.id),
            name=self._profile_name(handle, info),
            memory_mib=int(info.memorySizeMB),
            slice_count=int(info.sliceCount),
            sm_count=int(info.multiprocessorCount),
            instance_count=int(info.instanceCount),
            placements=placements,
        )

    def _profile(self, index: int, profile_name: str) -> DriverProfile:
        table = self.mig_profile_table(index)
        for profile in table:
            if profile.name == profile_name:
                return profile
        known = ", ".join(p.name for p in table) or "none: MIG is not supported here"
        raise InvalidRequest(
            f"GPU {index} has no MIG profile {profile_name!r} (the driver offers: {known})"
        )

    def set_mig_mode(self, index: int, enabled: bool, *, force: bool = False) -> None:
        nvml = self._nvml
        handle = self._handle(index)
        if not force:
            running = self._processes(index, handle)
            if running:
                pids = ", ".join(str(p.pid) for p in running)
                raise DeviceError(
                    f"GPU {index} runs processes ({pids}): stop them or use --force to change "
                    "its MIG mode"
                )
        mode = nvml.constant("NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE")
        # the driver may accept the change as pending until a GPU reset; the next snapshot's
        # `mig.pending` reports it
        nvml.command(
            "nvmlDeviceSetMigMode",
            handle,
            mode,
            what=f"{'enabling' if enabled else 'disabling'} MIG mode on GPU {index}",
        )

    def create_gpu_instance(self, index: int, profile_name: str, start: int) -> MigInstance:
        nvml = self._nvml
        handle = self._handle(index)
        profile = self._profile(index, profile_name)
        sizes = {s: size for s, size in profile.placements}
        if start not in sizes:
            starts = ", ".join(str(s) for s in sizes) or "none"
            raise InvalidRequest(
                f"{profile_name} cannot start at slot {start} on GPU {index} (valid: {starts})"
            )
        placement = nvml.constant("c_nvmlGpuInstancePlacement_t")(start, sizes[start])
        # pynvml hands `placement` to C as is, and C wants a pointer to it
        what = f"creating a {profile_name} GPU instance at slot {start} on GPU {index}"
        gi = nvml.command(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            handle,
            profile.profile_id,
            ctypes.pointer(placement),
            what=what,
        )
        info = nvml.command("nvmlGpuInstanceGetInfo", gi, what=what)
        try:
            ci_id = self._create_full_compute_instance(gi, profile, what)
        except DeviceError:
            # leave no GPU instance without its compute instance behind
            nvml.command("nvmlGpuInstanceDestroy", gi, what=f"{what} (undoing)")
            raise
        return MigInstance(
            gi_id=int(info.id),
            ci_id=ci_id,
            profile=profile.name,
            placement_start=int(info.placement.start),
            placement_size=int(info.placement.size),
            memory_total=profile.memory_mib * MiB,
        )

    def _create_full_compute_instance(self, gi: Any, profile: DriverProfile, what: str) -> int:
        nvml = self._nvml
        ci_profile = self._versioned_info(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            gi,
            nvml.constant(_ci_profile_constant(profile.slice_count), 0),
            nvml.constant("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0),
        )
        if ci_profile is NOT_AVAILABLE:
            raise NotAvailable(
                f"{what}: the driver offers no compute instance of {profile.slice_count} slices"
            )
        ci = nvml.command("nvmlGpuInstanceCreateComputeInstance", gi, ci_profile.id, what=what)
        return int(nvml.command("nvmlComputeInstanceGetInfo", ci, what=what).id)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        nvml = self._nvml
        handle = self._handle(index)
        what = f"destroying GPU instance {gi_id} on GPU {index}"
        gi = nvml.command("nvmlDeviceGetGpuInstanceById", handle, gi_id, what=what)
        for number in range(nvml.constant("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 0)):
            info = self._versioned_info(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                number,
                nvml.constant("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0),
            )
            if info is NOT_AVAILABLE:
                continue
            array, count = nvml.handle_array("c_nvmlComputeInstance_t", _MAX_PLACEMENTS)
            nvml.command("nvmlGpuInstanceGetComputeInstances", gi, info.id, array, count, what=what)
            for ci in array[: count.contents.value]:
                nvml.command("nvmlComputeInstanceDestroy", ci, what=what)
        nvml.command("nvmlGpuInstanceDestroy", gi, what=what)


def _instance_from_device(
    gi_id: int, ci_id: int, uuid: str, memory_total: int, name: str
) -> MigInstance:
    """A MIG instance known only from its MIG device: placement unknown without root."""
    match = _MIG_NAME.search(name)
    profile = match.group(1) if match else ""
    slices = int(profile.split("g.", 1)[0]) if profile else 0
    return MigInstance(gi_id, ci_id, profile, None, slices, memory_total, uuid)
