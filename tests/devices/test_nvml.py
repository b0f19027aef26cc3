"""The NVML backend on a scenario fake of pynvml: readings, NotSupported, lost GPUs, MIG."""

from __future__ import annotations

import logging

import pynvml
import pytest
from nvml_fake import FakeInstance, FakeNvml, nvml_error

from gpupool.core.errors import DeviceError, DriverNotFound, InvalidRequest
from gpupool.core.units import MiB
from gpupool.devices.nvml import NvmlBackend, model_of
from gpupool.devices.nvml_lib import NOT_AVAILABLE, Nvml
from gpupool.devices.snapshot import ProcessKind
from gpupool.mig import catalog


def test_snapshot_reads_every_field(nvml_backend: NvmlBackend, fake_nvml: FakeNvml) -> None:
    snap = nvml_backend.snapshot()
    assert snap.simulated is False
    assert snap.driver == "550.54.15"
    h100, a100 = snap.gpus
    assert (h100.index, h100.model, h100.name) == (0, "H100-80GB", "NVIDIA H100 80GB HBM3")
    assert h100.uuid == fake_nvml.gpus[0].uuid
    assert h100.pci_bus_id == "00000000:10:00.0"
    assert h100.memory_used == 4 << 30
    assert h100.memory_total == catalog.get_model("H100-80GB").memory_bytes
    assert h100.memory_free == h100.memory_total - h100.memory_used
    assert (h100.utilization, h100.temperature, h100.power_w) == (37, 51, 123.456)
    assert h100.mig is not None and h100.mig.current is False
    assert [(p.pid, p.memory_used, p.gpu_utilization) for p in h100.processes] == [
        (4242, 3 << 30, 80),
        (4343, 1 << 30, None),
    ]
    assert a100.model == "A100-40GB" and a100.healthy and a100.error is None
    assert a100.mig is not None and a100.mig.current and a100.mig.instances == ()


def test_each_process_has_the_kind_of_the_lists_it_is_in(
    nvml_backend: NvmlBackend, fake_nvml: FakeNvml
) -> None:
    # a display server is in the graphics list only; 4343 has a CUDA and an OpenGL context
    fake_nvml.gpus[0].graphics = [(4343, 2 << 30), (5151, 200 * MiB)]
    h100 = nvml_backend.snapshot().gpus[0]
    assert [(p.pid, p.kind, p.memory_used) for p in h100.processes] == [
        (4242, ProcessKind.COMPUTE, 3 << 30),
        (4343, ProcessKind.BOTH, 2 << 30),
        (5151, ProcessKind.GRAPHICS, 200 * MiB),
    ]
    assert h100.to_json()["processes"][2]["kind"] == "graphics"
    # a driver that does not give the compute list cannot say a process is graphics only
    base = "nvmlDeviceGetComputeRunningProcesses"
    fake_nvml.gpus[0].not_supported |= {f"{base}_v3", f"{base}_v2", base}
    h100 = nvml_backend.snapshot().gpus[0]
    assert [(p.pid, p.kind) for p in h100.processes] == [
        (4343, ProcessKind.BOTH),
        (5151, ProcessKind.BOTH),
    ]


def test_json_has_the_issue_schema(nvml_backend: NvmlBackend) -> None:
    data = nvml_backend.snapshot().to_json()
    assert data["simulated"] is False and data["driver"] == "550.54.15"
    gpu = data["gpus"][0]
    for key in ("index", "uuid", "name", "model", "memory_total", "memory_used", "utilization"):
        assert key in gpu
    assert gpu["processes"][0]["pid"] == 4242
    assert gpu["processes"][0]["memory_used"] == 3 << 30
    assert set(data["gpus"][1]["mig"]) >= {"current", "pending", "instances"}


def test_not_supported_on_one_gpu_gives_none_not_a_crash(
    not_supported_on_gpu1: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    h100, a100 = nvml_backend.snapshot().gpus
    assert (a100.utilization, a100.temperature, a100.power_w, a100.mig) == (None,) * 4
    assert a100.healthy
    assert h100.utilization == 37  # the other GPU is unaffected


def test_gpu_lost_marks_that_gpu_unhealthy(gpu_lost: FakeNvml, nvml_backend: NvmlBackend) -> None:
    lost, fine = nvml_backend.snapshot().gpus
    assert not lost.healthy
    assert lost.error is not None and "lost" in lost.error
    assert lost.utilization is None and lost.processes == ()
    assert fine.healthy and fine.model == "A100-40GB"


def test_gpu_lost_after_identity_keeps_what_was_read(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    fake_nvml.gpus[0].not_supported = set()
    original = fake_nvml.nvmlDeviceGetUtilizationRates

    def lost_midway(handle: object) -> object:
        fake_nvml.gpus[0].lost = True
        return original(handle)

    fake_nvml.nvmlDeviceGetUtilizationRates = lost_midway  # type: ignore[method-assign]
    gpu = nvml_backend.snapshot().gpus[0]
    assert not gpu.healthy
    assert gpu.uuid == fake_nvml.gpus[0].uuid and gpu.model == "H100-80GB"


def test_missing_functions_fall_back_and_are_logged_once(
    old_nvml: FakeNvml, nvml_backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gpupool.devices.nvml_lib"):
        first = nvml_backend.snapshot()
        nvml_backend.snapshot()
    assert [p.pid for p in first.gpus[0].processes] == [4242, 4343]  # via _v2
    assert first.gpus[0].pci_bus_id == "00000000:10:00.0"  # via the unversioned call
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in old_nvml.calls
    missing = [r.getMessage() for r in caplog.records if "not available here" in r.getMessage()]
    assert sum("ComputeRunningProcesses_v3" in m for m in missing) == 1
    assert sum("PciInfo_v3" in m for m in missing) == 1


def test_newest_versions_are_tried_first(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    nvml_backend.snapshot()
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in fake_nvml.calls
    assert "nvmlDeviceGetComputeRunningProcesses_v2" not in fake_nvml.calls
    assert "nvmlDeviceGetPciInfo_v3" in fake_nvml.calls


def test_driver_missing_is_one_clear_line(no_driver: FakeNvml) -> None:
    with pytest.raises(DriverNotFound) as caught:
        NvmlBackend(Nvml(no_driver))
    message = str(caught.value)
    assert message.startswith("NVIDIA driver not found: ")
    assert "--simulate 8xH100-80GB" in message and "\n" not in message
    assert caught.value.__cause__ is not None


def test_init_is_lazy_and_once(fake_nvml: FakeNvml) -> None:
    nvml = Nvml(fake_nvml)
    assert fake_nvml.calls == []
    assert nvml.query("nvmlDeviceGetCount") == 2
    assert nvml.query("nvmlDeviceGetCount") == 2
    assert fake_nvml.calls.count("nvmlInit") == 1


def test_query_maps_absent_things_to_not_available(fake_nvml: FakeNvml) -> None:
    nvml = Nvml(fake_nvml)
    assert nvml.query("nvmlNoSuchFunction") is NOT_AVAILABLE
    fake_nvml.gpus[0].not_supported.add("nvmlDeviceGetPowerUsage")
    assert nvml.query("nvmlDeviceGetPowerUsage", fake_nvml.gpus[0]) is NOT_AVAILABLE
    fake_nvml.privileged = False
    assert nvml.query("nvmlDeviceGetGpuInstanceById", fake_nvml.gpus[1], 1) is NOT_AVAILABLE


def test_other_nvml_errors_become_device_errors(fake_nvml: FakeNvml) -> None:
    nvml = Nvml(fake_nvml)
    with pytest.raises(DeviceError, match="nvmlDeviceGetHandleByIndex failed") as caught:
        nvml.query("nvmlDeviceGetHandleByIndex", 9)
    assert caught.value.__cause__ is not None


@pytest.mark.parametrize(
    ("name", "memory_gib", "pci", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 80, None, "H100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40, None, "A100-40GB"),
        ("NVIDIA Something", 0, 0x233510DE, "H200-141GB"),
        ("NVIDIA A100 80GB SXM custom", 80, None, "A100-80GB"),
        ("Tesla T4", 15, None, "Tesla T4"),
    ],
)
def test_model_of(name: str, memory_gib: int, pci: int | None, expected: str) -> None:
    assert model_of(name, memory_gib << 30, pci) == expected


def test_profile_table_comes_from_the_driver(nvml_backend: NvmlBackend) -> None:
    table = {p.name: p for p in nvml_backend.mig_profile_table(1)}
    model = catalog.get_model("A100-40GB")
    assert set(table) == set(model.profile_names)
    three = table["3g.20gb"]
    assert (three.profile_id, three.slice_count, three.memory_mib) == (9, 3, 19968)
    assert three.placements == ((0, 4), (4, 4))


def test_mig_instances_with_placement_when_privileged(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    profile = catalog.get_profile("A100-40GB", "3g.20gb")
    fake_nvml.gpus[1].instances = [FakeInstance(2, 0, profile, 4, "MIG-fake-2")]
    mig = nvml_backend.snapshot().gpus[1].mig
    assert mig is not None
    (instance,) = mig.instances
    assert (instance.gi_id, instance.ci_id, instance.profile) == (2, 0, "3g.20gb")
    assert (instance.placement_start, instance.placement_size) == (4, 4)
    assert instance.uuid == "MIG-fake-2"
    assert instance.memory_total == 19968 * MiB


def test_mig_instances_without_root_come_from_mig_devices(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    profile = catalog.get_profile("A100-40GB", "2g.10gb")
    fake_nvml.gpus[1].instances = [FakeInstance(5, 0, profile, 2, "MIG-fake-5")]
    fake_nvml.privileged = False
    mig = nvml_backend.snapshot().gpus[1].mig
    assert mig is not None
    (instance,) = mig.instances
    assert (instance.gi_id, instance.profile, instance.placement_size) == (5, "2g.10gb", 2)
    assert instance.placement_start is None  # the driver tells placements to root only


def test_create_and_destroy_gpu_instance(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    created = nvml_backend.create_gpu_instance(1, "3g.20gb", 4)
    assert (created.profile, created.placement_start, created.placement_size) == ("3g.20gb", 4, 4)
    assert created.ci_id == 0
    assert [i.gi_id for i in fake_nvml.gpus[1].instances] == [created.gi_id]
    nvml_backend.destroy_gpu_instance(1, created.gi_id)
    assert fake_nvml.gpus[1].instances == []


def test_create_rejects_unknown_profile_and_bad_start(nvml_backend: NvmlBackend) -> None:
    with pytest.raises(InvalidRequest, match=r"no MIG profile '9g.99gb'.*3g\.20gb"):
        nvml_backend.create_gpu_instance(1, "9g.99gb", 0)
    with pytest.raises(InvalidRequest, match="valid: 0, 4"):
        nvml_backend.create_gpu_instance(1, "3g.20gb", 2)


def test_mig_control_without_root_says_so(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    fake_nvml.privileged = False
    with pytest.raises(DeviceError, match="needs root"):
        nvml_backend.create_gpu_instance(1, "1g.5gb", 0)


def test_set_mig_mode_refuses_busy_gpu_and_reports_pending(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    with pytest.raises(DeviceError, match=r"runs processes \(4242, 4343\).*--force"):
        nvml_backend.set_mig_mode(0, True)
    assert "nvmlDeviceSetMigMode" not in fake_nvml.calls
    nvml_backend.set_mig_mode(0, True, force=True)
    mig = nvml_backend.snapshot().gpus[0].mig
    assert mig is not None and (mig.current, mig.pending) == (False, True)


def test_profile_table_is_asked_again_until_the_driver_gives_it(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    fake_nvml.gpus[0].not_supported |= {
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "nvmlDeviceGetGpuInstanceProfileInfoV",
    }
    assert nvml_backend.mig_profile_table(0) == []  # e.g. a driver that wants MIG mode first
    fake_nvml.gpus[0].not_supported.clear()
    assert len(nvml_backend.mig_profile_table(0)) == len(catalog.get_model("H100").profiles)


def test_memory_v2_falls_back_to_v1(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    original = fake_nvml.nvmlDeviceGetMemoryInfo

    def v1_only(handle: object, version: object = None) -> object:
        if version is not None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return original(handle)

    fake_nvml.nvmlDeviceGetMemoryInfo = v1_only  # type: ignore[method-assign]
    gpu = nvml_backend.snapshot().gpus[0]
    assert gpu.healthy and gpu.memory_used == 4 << 30


def test_driver_without_v2_profile_structs(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    fake_nvml.unresolved |= {
        "nvmlDeviceGetGpuInstanceProfileInfoV",
        "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
    }
    names = [p.name for p in nvml_backend.mig_profile_table(1)]
    assert sorted(names) == sorted(catalog.get_model("A100-40GB").profile_names)
    created = nvml_backend.create_gpu_instance(1, "1g.5gb+me", 3)
    assert (created.profile, created.placement_start, created.ci_id) == ("1g.5gb+me", 3, 0)


def test_a_command_first_still_reports_the_missing_driver(no_driver: FakeNvml) -> None:
    with pytest.raises(DriverNotFound, match="NVIDIA driver not found"):
        Nvml(no_driver).command("nvmlDeviceGetCount", what="counting GPUs")
