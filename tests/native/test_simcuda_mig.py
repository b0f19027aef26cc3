"""MIG instances on the simulated driver: a MIG-UUID in CUDA_VISIBLE_DEVICES is a device with the
instance's memory and SMs, its own memory count and its own (slower) kernel timeline."""

from __future__ import annotations

import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_simcuda import parse, probe, records, run_probe, sim_dir, sim_env

from gpupool.core.errors import DeviceError
from gpupool.devices.sim import state as simstate
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.node import SimNode
from gpupool.devices.sim.spec import parse_spec
from gpupool.devices.sim.state import mig_device_number
from gpupool.mig import catalog

__all__ = ["probe", "sim_dir"]  # fixtures, imported for pytest

H100 = catalog.get_model("H100")
SMALL = H100.profile("1g.10gb")


@pytest.fixture
def mig_node(tmp_path: Path) -> Iterator[SimNode]:
    """GPU 0 an H100 in MIG mode with a 1g.10gb and a 3g.40gb; GPU 1 a whole H100."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("gpus:\n  - model: H100\n    mig: [1g.10gb, 3g.40gb]\n  - model: H100\n")
    node = SimNode.open_or_create(parse_spec(str(spec)), tmp_path / "node")
    yield node
    node.close()


def small_uuid(node: SimNode) -> str:
    return next(i.uuid for i in node.gpu(0).instances if i.profile == "1g.10gb")


def test_a_mig_uuid_is_a_device_of_the_instance_s_size(
    probe: Path, sim_dir: Path, mig_node: SimNode
) -> None:
    uuid = small_uuid(mig_node)
    result = run_probe(probe, sim_dir, mig_node.directory, "enum", CUDA_VISIBLE_DEVICES=uuid)
    (dev,) = records(result, "dev")
    assert dev["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert (int(dev["total"]), dev["sm"], dev["major"]) == (SMALL.memory_bytes, "16", "9")
    assert dev["uuid"] == uuid[4:].replace("-", "")
    # a GPU-UUID or an index still names the whole GPU; an unknown MIG-UUID no device at all
    whole = run_probe(probe, sim_dir, mig_node.directory, "enum", CUDA_VISIBLE_DEVICES="1")
    assert int(records(whole, "dev")[0]["total"]) == H100.memory_bytes
    unknown = run_probe(probe, sim_dir, mig_node.directory, "enum", CUDA_VISIBLE_DEVICES="MIG-x")
    assert records(unknown, "init") == [{"kind": "init", "rc": "100"}]


def test_memory_is_the_instance_s_and_shows_on_its_gpu(
    probe: Path, sim_dir: Path, mig_node: SimNode
) -> None:
    uuid = small_uuid(mig_node)
    half = SMALL.memory_bytes // 2
    proc = subprocess.Popen(
        [str(probe), "alloc", str(half), str(half + 4096), str(half)],
        env=sim_env(sim_dir, mig_node.directory, CUDA_VISIBLE_DEVICES=uuid),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    while not (line := proc.stdout.readline()).startswith("ready"):
        lines.append(line)
    allocs = [r for r in parse("".join(lines)) if r["kind"] == "alloc"]
    assert [a["rc"] for a in allocs] == ["0", "2", "0"]  # out of memory past the instance's size
    gpu0, gpu1 = SimulatedBackend(mig_node).snapshot().gpus  # the fixture closes the node
    assert [(p.pid, p.memory_used) for p in gpu0.processes] == [(proc.pid, 2 * half)]
    assert gpu0.memory_used == 2 * half and gpu1.memory_used == 0
    # the driver refuses to destroy an instance in use, as NVML does
    gi_id = next(i.gi_id for i in mig_node.gpu(0).instances if i.uuid == uuid)
    with pytest.raises(DeviceError, match=f"in use by processes {proc.pid}"):
        mig_node.destroy_instance(0, gi_id)
    proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0
    assert [s for s in mig_node.state.procs() if s.gpu == mig_device_number(0, gi_id)] == []


def test_a_destroyed_instance_is_gone_and_a_new_one_starts_afresh(
    probe: Path, sim_dir: Path, mig_node: SimNode
) -> None:
    old = next(i for i in mig_node.gpu(0).instances if i.profile == "1g.10gb")
    mig_node.destroy_instance(0, old.gi_id)
    gone = run_probe(probe, sim_dir, mig_node.directory, "enum", CUDA_VISIBLE_DEVICES=old.uuid)
    assert records(gone, "init") == [{"kind": "init", "rc": "100"}]
    new = mig_node.create_instance(0, "2g.20gb", 0)
    result = run_probe(probe, sim_dir, mig_node.directory, "enum", CUDA_VISIBLE_DEVICES=new.uuid)
    (dev,) = records(result, "dev")
    assert int(dev["total"]) == H100.profile("2g.20gb").memory_bytes and dev["sm"] == "32"


def test_a_kernel_takes_longer_on_fewer_sms(probe: Path, sim_dir: Path, mig_node: SimNode) -> None:
    """Time is proportional to the grid over the SMs: a 16-SM instance of a 132-SM GPU runs the
    same kernels about 132/16 = 8.25 times as long."""
    args = ("kernels", "5", "256", "128")
    whole = records(run_probe(probe, sim_dir, mig_node.directory, *args), "kernels")[0]
    uuid = small_uuid(mig_node)
    small = run_probe(probe, sim_dir, mig_node.directory, *args, CUDA_VISIBLE_DEVICES=uuid)
    ratio = float(records(small, "kernels")[0]["event_ms"]) / float(whole["event_ms"])
    assert 7.5 < ratio < 9.0, ratio


def test_a_node_made_by_an_earlier_gpupool_gets_a_state_of_this_layout(tmp_path: Path) -> None:
    """node.json (the inventory and MIG layout) stays; the counters start afresh."""
    node = SimNode.open_or_create(parse_spec("1xH100"), tmp_path)
    node.close()
    state = tmp_path / "state.bin"
    old = bytearray(state.read_bytes())
    struct.pack_into("<I", old, 8, simstate.VERSION - 1)
    state.write_bytes(bytes(old[: simstate.MIG_OFFSET]))  # version 1 ended there
    reopened = SimNode.open_or_create(None, tmp_path)
    assert reopened.state.gpu(0).model == "H100-80GB"
    reopened.close()
