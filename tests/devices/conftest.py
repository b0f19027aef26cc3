"""NVML scenario fixtures: the NVML backend on a fake pynvml, no GPU needed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from nvml_fake import FakeNvml

from gpupool.devices.nvml import NvmlBackend
from gpupool.devices.nvml_lib import Nvml


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """A healthy node: GPU 0 an H100-80GB running two processes, GPU 1 an A100-40GB in MIG mode."""
    fake = FakeNvml(["H100-80GB", "A100-40GB"])
    fake.gpus[0].processes = [(4242, 3 << 30), (4343, 1 << 30)]
    fake.gpus[0].memory_used = 4 << 30
    fake.gpus[0].process_sm_util = {4242: 80}
    fake.gpus[1].mig_current = fake.gpus[1].mig_pending = True
    return fake


@pytest.fixture
def nvml_backend(fake_nvml: FakeNvml) -> Iterator[NvmlBackend]:
    backend = NvmlBackend(Nvml(fake_nvml))
    yield backend
    backend.close()


@pytest.fixture
def gpu_lost(fake_nvml: FakeNvml) -> FakeNvml:
    """GPU 0 fell off the bus."""
    fake_nvml.gpus[0].lost = True
    return fake_nvml


@pytest.fixture
def not_supported_on_gpu1(fake_nvml: FakeNvml) -> FakeNvml:
    """GPU 1 answers NotSupported for utilisation, temperature, power and MIG mode."""
    fake_nvml.gpus[1].not_supported = {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetMigMode",
    }
    return fake_nvml


@pytest.fixture
def old_nvml(fake_nvml: FakeNvml) -> FakeNvml:
    """An older stack: pynvml without the _v3 process call, a library without the v3 PCI call."""
    fake_nvml.hidden.add("nvmlDeviceGetComputeRunningProcesses_v3")
    fake_nvml.unresolved.add("nvmlDeviceGetPciInfo_v3")
    return fake_nvml


@pytest.fixture
def no_driver() -> FakeNvml:
    """A machine without the NVIDIA driver: nvmlInit finds no library."""
    return FakeNvml([], driver_missing=True)
