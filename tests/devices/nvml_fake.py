"""A scenario fake of the `pynvml` module: GPUs from the MIG catalog, driven like a real node.

It keeps pynvml's own error classes, constants and ctypes structures (importing pynvml needs no
driver), and replaces the functions with ones that answer from `FakeGpu` objects. Scenarios:
a missing driver, a lost GPU, NotSupported queries on one GPU, functions absent from the module
or the library, no root for the GPU instance tables.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real

from gpupool.mig import catalog

_TOKEN_BASE = 0x10000


def nvml_error(code: int) -> Exception:
    """The pynvml exception (subclass picked by pynvml itself) for an NVML return code."""
    return real.NVMLError(code)


@dataclass
class FakeInstance:
    """A GPU instance with one compute instance."""

    gi_id: int
    ci_id: int | None
    profile: catalog.MigProfile
    start: int
    uuid: str


@dataclass
class FakeGpu:
    """One GPU of the fake node; scenario switches are plain attributes."""

    index: int
    model: catalog.GpuModel
    memory_used: int = 0
    utilization: int = 37
    temperature: int = 51
    power_mw: int = 123_456
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    #: the graphics list (a display server; a pid in both lists has both contexts)
    graphics: list[tuple[int, int]] = field(default_factory=list)
    process_sm_util: dict[int, int] = field(default_factory=dict)
    mig_current: bool = False
    mig_pending: bool = False
    instances: list[FakeInstance] = field(default_factory=list)
    lost: bool = False
    #: NVML functions that answer NVML_ERROR_NOT_SUPPORTED on this GPU
    not_supported: set[str] = field(default_factory=set)

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-0000-0000-{self.index:012d}"


@dataclass
class FakeMigDevice:
    gpu: FakeGpu
    instance: FakeInstance


class FakeNvml:
    """Stands in for the pynvml module; see the module docstring for the scenarios."""

    def __init__(self, models: list[str], *, driver_missing: bool = False) -> None:
        self.gpus = [FakeGpu(i, catalog.get_model(m)) for i, m in enumerate(models)]
        self.driver_missing = driver_missing
        #: attributes this "pynvml" lacks (an older nvidia-ml-py)
        self.hidden: set[str] = set()
        #: functions whose symbol the "driver library" lacks (NVML_ERROR_FUNCTION_NOT_FOUND)
        self.unresolved: set[str] = set()
        self.privileged = True
        self.calls: list[str] = []
        self.initialized = False
        self._tokens: dict[int, Any] = {}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "hidden"):
            raise AttributeError(name)
        if name.startswith(("NVML", "c_nvml", "nvmlMemory_v2", "NVMLError")):
            return getattr(real, name)
        return object.__getattribute__(self, name)

    # -- plumbing --

    def _enter(self, name: str, handle: Any = None) -> None:
        self.calls.append(name)
        if name in self.unresolved:
            raise nvml_error(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self.initialized and name != "nvmlInit":
            raise nvml_error(real.NVML_ERROR_UNINITIALIZED)
        gpu = self._gpu_of(handle)
        if gpu is not None and gpu.lost:
            raise nvml_error(real.NVML_ERROR_GPU_IS_LOST)
        if gpu is not None and name in gpu.not_supported:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)

    def _gpu_of(self, handle: Any) -> FakeGpu | None:
        handle = self._resolve(handle)
        if isinstance(handle, FakeGpu):
            return handle
        if isinstance(handle, FakeMigDevice):
            return handle.gpu
        if isinstance(handle, tuple):  # (gpu, instance) GPU and compute instance handles
            gpu = handle[0]
            assert isinstance(gpu, FakeGpu)
            return gpu
        return None

    def _token(self, value: Any, kind: Any) -> Any:
        """A ctypes handle standing for `value`, as the driver fills handle arrays."""
        token = _TOKEN_BASE + len(self._tokens)
        self._tokens[token] = value
        return ctypes.cast(ctypes.c_void_p(token), kind)

    def _resolve(self, handle: Any) -> Any:
        if isinstance(handle, ctypes._Pointer):
            return self._tokens[ctypes.cast(handle, ctypes.c_void_p).value or 0]
        return handle

    def _privileged(self) -> None:
        if not self.privileged:
            raise nvml_error(real.NVML_ERROR_NO_PERMISSION)

    # -- init, system --

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.driver_missing:
            raise nvml_error(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            raise nvml_error(real.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # -- device queries (a GPU or a MIG device handle) --

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return handle.instance.uuid if isinstance(handle, FakeMigDevice) else handle.uuid

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        self._enter("nvmlDeviceGetName", handle)
        if isinstance(handle, FakeMigDevice):
            name = f"{handle.gpu.model.marketing_name} MIG {handle.instance.profile.name}"
        else:
            name = handle.model.marketing_name
        return name.encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetPciInfo_v3(self, handle: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetPciInfo_v3", handle)
        return self.nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(
            busId=f"00000000:{0x10 + handle.index:02X}:00.0".encode(),
            pciDeviceId=int(handle.model.pci_device_id, 16),
        )

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(handle, FakeMigDevice):
            total, used = handle.instance.profile.memory_bytes, 0
        else:
            total, used = handle.model.memory_bytes, handle.memory_used
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=handle.utilization, memory=10)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        return handle.temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return handle.power_mw

    def _running(self, name: str, handle: FakeGpu) -> list[Any]:
        self._enter(name, handle)
        listed = handle.graphics if "Graphics" in name else handle.processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: FakeGpu) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeGpu) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses", handle)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: FakeGpu) -> list[Any]:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)

    def nvmlDeviceGetProcessUtilization(self, handle: FakeGpu, since: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", handle)
        if not handle.process_sm_util:
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        return [
            SimpleNamespace(pid=pid, smUtil=util, timeStamp=since + 1000)
            for pid, util in handle.process_sm_util.items()
        ]

    # -- MIG --

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        return [int(handle.mig_current), int(handle.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: FakeGpu, mode: int) -> int:
        self._enter("nvmlDeviceSetMigMode", handle)
        self._privileged()
        handle.mig_pending = bool(mode)  # applied at the next GPU reset, as on most boards
        return int(real.NVML_SUCCESS)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if handle.model.profiles else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, slot: int) -> FakeMigDevice:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        with_ci = [i for i in handle.instances if i.ci_id is not None]
        if slot >= len(with_ci):
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        return FakeMigDevice(handle, with_ci[slot])

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeMigDevice) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        return handle.instance.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeMigDevice) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", handle)
        assert handle.instance.ci_id is not None
        return handle.instance.ci_id

    def _profile_by_id(self, gpu: FakeGpu, profile_id: int) -> catalog.MigProfile:
        for profile in gpu.model.profiles:
            if profile.smi_id == profile_id:
                return profile
        raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: FakeGpu, number: int, version: int = 2
    ) -> Any:
        # pynvml's default (version 2) calls the V symbol, whose struct carries the name
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo" + ("V" if version == 2 else ""), handle)
        if number >= real.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        for p in handle.model.profiles:
            if p.nvml_profile == number:
                info = SimpleNamespace(
                    id=p.smi_id,
                    sliceCount=p.compute_slices,
                    instanceCount=p.max_instances,
                    multiprocessorCount=p.sm_count,
                    memorySizeMB=p.memory_mib,
                )
                if version == 2:
                    info.name = f"MIG {p.name}".encode()
                return info
        raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: FakeGpu, profile_id: int, placements: Any, count: Any
    ) -> int:
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements", handle)
        profile = self._profile_by_id(handle, profile_id)
        for n, start in enumerate(profile.starts):
            placements[n].start, placements[n].size = start, profile.size
        count.contents.value = len(profile.starts)
        return 0

    def nvmlDeviceGetGpuInstances(
        self, handle: FakeGpu, profile_id: int, array: Any, count: Any
    ) -> int:
        self._enter("nvmlDeviceGetGpuInstances", handle)
        self._privileged()
        found = [i for i in handle.instances if i.profile.smi_id == profile_id]
        for n, instance in enumerate(found):
            array[n] = self._token((handle, instance), real.c_nvmlGpuInstance_t)
        count.contents.value = len(found)
        return 0

    def nvmlDeviceGetGpuInstanceById(self, handle: FakeGpu, gi_id: int) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceById", handle)
        self._privileged()
        for instance in handle.instances:
            if instance.gi_id == gi_id:
                return (handle, instance)
        raise nvml_error(real.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> Any:
        self._enter("nvmlGpuInstanceGetInfo", gi)
        _, instance = self._resolve(gi)
        placement = SimpleNamespace(start=instance.start, size=instance.profile.size)
        return SimpleNamespace(
            id=instance.gi_id, profileId=instance.profile.smi_id, placement=placement
        )

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: FakeGpu, profile_id: int, placement: Any
    ) -> Any:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
        self._privileged()
        if not handle.mig_current:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(handle, profile_id)
        placement = placement.contents  # C takes a pointer to the placement
        taken = {s for i in handle.instances for s in i.profile.slots(i.start)}
        if placement.start not in profile.starts or taken & set(profile.slots(placement.start)):
            raise nvml_error(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = max((i.gi_id for i in handle.instances), default=0) + 1
        instance = FakeInstance(gi_id, None, profile, placement.start, f"MIG-fake-{gi_id}")
        handle.instances.append(instance)
        return (handle, instance)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: Any, number: int, engines: int, version: int = 2
    ) -> Any:
        name = "nvmlGpuInstanceGetComputeInstanceProfileInfo" + ("V" if version == 2 else "")
        self._enter(name, gi)
        _, instance = self._resolve(gi)
        if number >= real.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        wanted = getattr(
            real, f"NVML_COMPUTE_INSTANCE_PROFILE_{instance.profile.compute_slices}_SLICE"
        )
        if number != wanted:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=100 + number, instanceCount=1)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, profile_id: int) -> Any:
        self._enter("nvmlGpuInstanceCreateComputeInstance", gi)
        gpu, instance = self._resolve(gi)
        instance.ci_id = 0
        return (gpu, instance, 0)

    def nvmlComputeInstanceGetInfo(self, ci: Any) -> Any:
        self._enter("nvmlComputeInstanceGetInfo", ci)
        return SimpleNamespace(id=self._resolve(ci)[2])

    def nvmlGpuInstanceGetComputeInstances(
        self, gi: Any, profile_id: int, array: Any, count: Any
    ) -> int:
        self._enter("nvmlGpuInstanceGetComputeInstances", gi)
        gpu, instance = self._resolve(gi)
        if instance.ci_id is None:
            count.contents.value = 0
            return 0
        array[0] = self._token((gpu, instance, instance.ci_id), real.c_nvmlComputeInstance_t)
        count.contents.value = 1
        return 0

    def nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        self._enter("nvmlComputeInstanceDestroy", ci)
        self._resolve(ci)[1].ci_id = None
        return 0

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        self._enter("nvmlGpuInstanceDestroy", gi)
        gpu, instance = self._resolve(gi)
        if instance.ci_id is not None:
            raise nvml_error(real.NVML_ERROR_IN_USE)
        gpu.instances.remove(instance)
        return 0
