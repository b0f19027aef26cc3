"""The node a share launches on, read through the devices layer (NVML or a simulated node)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvml_fake import FakeNvml

from gpupool.core.errors import DeviceError, DriverNotFound, InvalidRequest
from gpupool.core.units import MemoryShare
from gpupool.devices.factory import open_backend
from gpupool.devices.nvml import NvmlBackend
from gpupool.devices.nvml_lib import Nvml
from gpupool.devices.sim.spec import ENV_NODE_DIR
from gpupool.isolation.launch import memory_bytes
from gpupool.isolation.node import launch_node, open_launch_node
from gpupool.mig import catalog


def nvml_node(fake: FakeNvml) -> NvmlBackend:
    return NvmlBackend(Nvml(fake))


def test_real_gpus_give_their_memory_totals() -> None:
    with nvml_node(FakeNvml(["H100-80GB", "A100-40GB"])) as backend:
        node = launch_node(backend)
    h100, a100 = (catalog.get_model(m).memory_bytes for m in ("H100-80GB", "A100-40GB"))
    assert node.sim_node is None and node.sim_spec is None
    assert node.totals_of([1, 0]) == [a100, h100]
    assert memory_bytes(MemoryShare(fraction=0.5), node.totals_of([1])[0]) == a100 // 2


def test_an_unknown_gpu_index_lists_the_valid_ones() -> None:
    with nvml_node(FakeNvml(["A30", "A30"])) as backend:
        node = launch_node(backend)
    with pytest.raises(InvalidRequest, match=r"^invalid GPU index 2: this node has GPUs 0\.\.1$"):
        node.totals_of([0, 2])


def test_a_lost_gpu_has_no_total_to_resolve_a_fraction() -> None:
    fake = FakeNvml(["H100-80GB", "A30"])
    fake.gpus[0].lost = True
    with nvml_node(fake) as backend:
        node = launch_node(backend)
    assert node.totals_of([0, 1]) == [None, catalog.get_model("A30").memory_bytes]
    with pytest.raises(InvalidRequest, match="total memory is unknown"):
        memory_bytes(MemoryShare(fraction=0.5), node.totals_of([0])[0])


def test_no_driver_is_one_line_with_the_fix() -> None:
    fake = FakeNvml([], driver_missing=True)
    with pytest.raises(DriverNotFound, match=r"^NVIDIA driver not found: .*--simulate") as err:
        launch_node(nvml_node(fake))
    assert "\n" not in str(err.value)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(ENV_NODE_DIR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path


def test_the_same_spec_is_the_node_gpus_shows(runtime_dir: Path) -> None:
    node = open_launch_node("2xA30")
    with open_backend("2xA30") as backend:
        assert backend.snapshot().node_dir == str(node.sim_node)
    assert node.sim_node is not None and node.sim_node.parent == runtime_dir / "gpupool-sim"
    assert (node.sim_spec, node.models) == ("2xA30", ("A30-24GB", "A30-24GB"))
    assert (node.sim_node / "node.json").is_file() and (node.sim_node / "state.bin").is_file()


def test_a_node_dir_or_the_env_reaches_a_node_made_by_gpus(
    runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node_dir = runtime_dir / "mine"
    with open_backend("1xH100", node_dir) as backend:
        uuids = [g.uuid for g in backend.snapshot().gpus]
    by_dir = open_launch_node(None, node_dir)
    assert (by_dir.sim_node, by_dir.sim_spec, by_dir.models) == (node_dir, "1xH100", ("H100-80GB",))
    monkeypatch.setenv(ENV_NODE_DIR, str(node_dir))
    assert open_launch_node(None).sim_node == node_dir
    with open_backend(None) as backend:
        assert [g.uuid for g in backend.snapshot().gpus] == uuids
    with pytest.raises(DeviceError, match="holds another simulated node"):
        open_launch_node("2xA30", node_dir)
