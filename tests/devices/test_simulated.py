"""The simulated backend: readings from the shared state, scenarios, MIG with hardware rules."""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.core.errors import DeviceError, InvalidRequest
from gpupool.core.units import GiB
from gpupool.devices.factory import open_backend
from gpupool.devices.procfs import process_start_time
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.state import FLAG_NOT_SUPPORTED, PROC_BOTH, PROC_GRAPHICS, SimProcSlot
from gpupool.devices.snapshot import ProcessKind
from gpupool.mig import catalog

#: the spec of the `sim_node` fixture (tests/conftest.py)
SIM_SPEC = "2xA30,1xH100-80GB"


def test_idle_node_is_announced_and_described(sim_node: SimulatedBackend) -> None:
    snap = sim_node.snapshot()
    assert snap.simulated is True and snap.driver == "simulated"
    assert snap.node_dir == str(sim_node.node_dir)
    assert [g.model for g in snap.gpus] == ["A30-24GB", "A30-24GB", "H100-80GB"]
    h100 = snap.gpus[2]
    model = catalog.get_model("H100-80GB")
    assert h100.name == model.marketing_name and h100.memory_total == model.memory_bytes
    assert (h100.memory_used, h100.memory_free) == (0, model.memory_bytes)
    assert h100.utilization == 0 and h100.healthy and h100.processes == ()
    assert h100.temperature is not None and h100.power_w is not None
    assert h100.mig is not None and not h100.mig.current
    assert len({g.uuid for g in snap.gpus}) == 3
    assert all(g.uuid.startswith("GPU-") for g in snap.gpus)


def test_same_spec_reuses_the_same_node(sim_node: SimulatedBackend) -> None:
    sim_node.set_mig_mode(2, True)
    with SimulatedBackend.open(SIM_SPEC, sim_node.node_dir) as again:
        snap = again.snapshot()
    assert [g.uuid for g in snap.gpus] == [g.uuid for g in sim_node.snapshot().gpus]
    assert snap.gpus[2].mig is not None and snap.gpus[2].mig.current


def test_default_dir_is_per_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPOOL_SIM_NODE", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with open_backend("2xA30") as one, open_backend("2x a30".replace(" ", "")) as two:
        assert isinstance(one, SimulatedBackend) and isinstance(two, SimulatedBackend)
        assert one.node_dir == two.node_dir
        assert one.node_dir.parent == tmp_path / "gpupool-sim"
    with open_backend("1xH100") as other:
        assert isinstance(other, SimulatedBackend) and other.node_dir != one.node_dir


def test_env_var_names_the_node(sim_node_env: SimulatedBackend) -> None:
    with open_backend(None) as backend:
        assert backend.simulated and len(backend.snapshot().gpus) == 3
        assert backend.snapshot().node_dir == str(sim_node_env.node_dir)


def test_another_spec_in_a_used_dir_is_refused(sim_node: SimulatedBackend) -> None:
    with pytest.raises(DeviceError, match="holds another simulated node"):
        SimulatedBackend.open("1xB200", sim_node.node_dir)


def test_no_node_in_dir(sim_node_dir: Path) -> None:
    with pytest.raises(DeviceError, match=r"no simulated node in .*--simulate"):
        SimulatedBackend.open(None, sim_node_dir)


def test_live_process_shows_with_its_memory(
    sim_node: SimulatedBackend, sim_live_process: Any
) -> None:
    gpu = sim_node.snapshot().gpus[0]
    (process,) = gpu.processes
    assert (process.pid, process.name, process.memory_used) == (
        sim_live_process.pid,
        "sleep",
        2 * GiB,
    )
    assert gpu.memory_used == 2 * GiB
    assert gpu.memory_free == gpu.memory_total - 2 * GiB


def test_vanished_pids_are_skipped_and_their_memory_not_counted(
    sim_node: SimulatedBackend, sim_vanished_pids: Any
) -> None:
    gpu = sim_node.snapshot().gpus[0]
    assert gpu.processes == ()
    assert gpu.memory_used == 0


def test_gpu_memory_is_what_live_processes_hold(
    sim_node: SimulatedBackend, sim_live_process: Any
) -> None:
    killed = subprocess.Popen(["sleep", "300"])
    start = process_start_time(killed.pid)
    assert start is not None
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    state = sim_node.node.state
    state.write_proc(1, SimProcSlot(1, killed.pid, 0, start, 1 * GiB, 0, 0))
    # the driver's counter still holds the killed process's GiB, and 2 GiB more left by an
    # update a reader caught half-way: neither is memory in use
    state.set_gpu_usage(0, sim_live_process.memory_used + 3 * GiB, 0)
    gpu = sim_node.snapshot().gpus[0]
    assert [p.pid for p in gpu.processes] == [sim_live_process.pid]
    assert gpu.memory_used == sim_live_process.memory_used == 2 * GiB
    assert gpu.memory_free == gpu.memory_total - 2 * GiB


def test_each_process_has_the_kind_its_slot_records(
    sim_node: SimulatedBackend, sim_live_process: Any
) -> None:
    # the driver's own slots are compute; a display server's is staged as NVML would list it
    staged = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    try:
        for slot, (process, kind) in enumerate(
            zip(staged, (PROC_GRAPHICS, PROC_BOTH), strict=True), 1
        ):
            start = process_start_time(process.pid)
            assert start is not None
            sim_node.node.state.write_proc(
                slot, SimProcSlot(slot, process.pid, 0, start, GiB, 0, 0, kind)
            )
        listed = {p.pid: p.kind for p in sim_node.snapshot().gpus[0].processes}
        assert listed == {
            sim_live_process.pid: ProcessKind.COMPUTE,
            staged[0].pid: ProcessKind.GRAPHICS,
            staged[1].pid: ProcessKind.BOTH,
        }
    finally:
        for process in staged:
            process.kill()
            process.wait()


def test_gpu_lost(sim_gpu_lost: SimulatedBackend) -> None:
    lost, fine, _ = sim_gpu_lost.snapshot().gpus
    assert not lost.healthy and lost.error == "GPU is lost (simulated)"
    assert lost.utilization is None and lost.mig is None
    assert fine.healthy
    with pytest.raises(DeviceError, match="GPU 0 is lost"):
        sim_gpu_lost.set_mig_mode(0, True)


def test_not_supported_hides_optional_readings(sim_not_supported: SimulatedBackend) -> None:
    gpus = sim_not_supported.snapshot().gpus
    assert (gpus[1].utilization, gpus[1].temperature, gpus[1].power_w) == (None, None, None)
    assert gpus[1].healthy and gpus[1].memory_total > 0
    assert gpus[0].utilization == 0


class SteppedClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def test_utilization_from_busy_counter_deltas(sim_node: SimulatedBackend) -> None:
    state, clock = sim_node.node.state, SteppedClock()
    sim_node.clock = clock
    sim_node.snapshot()
    clock.now += 200 * 10**6
    state.set_gpu_usage(2, 0, 50 * 10**6)  # 50 ms of kernels in 200 ms
    assert sim_node.snapshot().gpus[2].utilization == 25
    clock.now += 100 * 10**6
    assert sim_node.snapshot().gpus[2].utilization == 0  # nothing ran since
    clock.now += 10**9
    state.set_gpu_usage(2, 0, 60 * 10**9)  # more busy time than wall time: clamped
    assert sim_node.snapshot().gpus[2].utilization == 100


def test_first_snapshot_samples_twice(sim_node: SimulatedBackend) -> None:
    started = time.monotonic()
    assert sim_node.snapshot().gpus[0].utilization == 0
    assert time.monotonic() - started >= 0.05


def test_long_running_kernel_counts_as_busy(sim_node: SimulatedBackend) -> None:
    import struct

    from gpupool.devices.sim.state import GPU_RECORD_SIZE, GPUS_OFFSET

    clock = SteppedClock()
    sim_node.clock = clock
    sim_node.snapshot()
    clock.now += 10**9
    # busy_until_ns (offset 200 in the GPU record): a kernel queued to end in an hour
    until = clock.now + 3600 * 10**9
    struct.pack_into("<Q", sim_node.node.state._map, GPUS_OFFSET + GPU_RECORD_SIZE + 200, until)
    assert sim_node.snapshot().gpus[1].utilization == 100


def test_per_process_utilization(sim_node: SimulatedBackend, sim_live_process: Any) -> None:
    state, clock = sim_node.node.state, SteppedClock()
    sim_node.clock = clock
    sim_node.snapshot()
    (slot,) = (s for s in state.procs() if s.pid == sim_live_process.pid)
    clock.now += 100 * 10**6
    state.write_proc(slot.slot, dataclasses.replace(slot, busy_ns=slot.busy_ns + 40 * 10**6))
    (process,) = sim_node.snapshot().gpus[0].processes
    assert (process.pid, process.gpu_utilization) == (sim_live_process.pid, 40)
    clock.now += 100 * 10**6
    (process,) = sim_node.snapshot().gpus[0].processes
    assert process.gpu_utilization == 0


def test_not_supported_hides_per_process_utilization(
    sim_node: SimulatedBackend, sim_live_process: Any
) -> None:
    sim_node.node.state.set_flags(0, FLAG_NOT_SUPPORTED)
    (process,) = sim_node.snapshot().gpus[0].processes
    assert process.gpu_utilization is None and process.memory_used == 2 * GiB


# -- MIG --------------------------------------------------------------------------------


def test_mig_enable_create_destroy_disable(sim_node: SimulatedBackend) -> None:
    sim_node.set_mig_mode(2, True)
    three = sim_node.create_gpu_instance(2, "3g.40gb", 4)
    four = sim_node.create_gpu_instance(2, "4g.40gb", 0)
    assert (three.placement_start, three.placement_size, three.ci_id) == (4, 4, 0)
    assert three.memory_total == catalog.get_profile("H100", "3g.40gb").memory_bytes
    assert three.gi_id != four.gi_id and three.uuid and three.uuid.startswith("MIG-")
    mig = sim_node.snapshot().gpus[2].mig
    assert mig is not None and (mig.current, mig.pending) == (True, True)
    assert [(i.profile, i.placement_start) for i in mig.instances] == [
        ("4g.40gb", 0),
        ("3g.40gb", 4),
    ]
    with pytest.raises(DeviceError, match="destroy them before disabling"):
        sim_node.set_mig_mode(2, False)
    sim_node.destroy_gpu_instance(2, three.gi_id)
    sim_node.destroy_gpu_instance(2, four.gi_id)
    sim_node.set_mig_mode(2, False)
    mig = sim_node.snapshot().gpus[2].mig
    assert mig is not None and not mig.current and mig.instances == ()


def test_mig_rules_match_the_hardware(sim_node: SimulatedBackend) -> None:
    with pytest.raises(DeviceError, match="not in MIG mode"):
        sim_node.create_gpu_instance(0, "1g.6gb", 0)
    sim_node.set_mig_mode(0, True)
    with pytest.raises(
        InvalidRequest, match=r"unknown MIG profile '3g.40gb' for A30-24GB.*1g\.6gb"
    ):
        sim_node.create_gpu_instance(0, "3g.40gb", 0)
    with pytest.raises(InvalidRequest, match=r"cannot start at slot 1.*valid starts: 0, 2"):
        sim_node.create_gpu_instance(0, "2g.12gb", 1)
    first = sim_node.create_gpu_instance(0, "2g.12gb", 0)
    with pytest.raises(
        InvalidRequest,
        match=rf"1g\.6gb at slot 1 .* overlaps 2g\.12gb \(GPU instance {first.gi_id}\)",
    ):
        sim_node.create_gpu_instance(0, "1g.6gb", 1)
    sim_node.create_gpu_instance(0, "1g.6gb+me", 2)
    with pytest.raises(InvalidRequest, match=r"already has 1 1g\.6gb\+me"):
        sim_node.create_gpu_instance(0, "1g.6gb+me", 3)
    with pytest.raises(InvalidRequest, match="no GPU instance 42"):
        sim_node.destroy_gpu_instance(0, 42)


def test_full_gpu_refuses_more(sim_node: SimulatedBackend) -> None:
    sim_node.set_mig_mode(2, True)
    for start in range(7):
        sim_node.create_gpu_instance(2, "1g.10gb", start)
    with pytest.raises(InvalidRequest, match="already has 7"):
        sim_node.create_gpu_instance(2, "1g.10gb", 6)
    with pytest.raises(InvalidRequest, match=r"1g\.20gb at slots 6-7 .* overlaps 1g\.10gb"):
        sim_node.create_gpu_instance(2, "1g.20gb", 6)


def test_mig_mode_change_refused_while_a_process_runs(
    sim_node: SimulatedBackend, sim_live_process: Any
) -> None:
    with pytest.raises(DeviceError, match=rf"runs processes \({sim_live_process.pid}\).*--force"):
        sim_node.set_mig_mode(0, True)
    sim_node.set_mig_mode(1, True)  # another GPU is free
    sim_node.set_mig_mode(0, True, force=True)
    mig = sim_node.snapshot().gpus[0].mig
    assert mig is not None and mig.current


def test_profile_table_is_the_catalog(sim_node: SimulatedBackend) -> None:
    table = sim_node.mig_profile_table(2)
    model = catalog.get_model("H100-80GB")
    assert [p.name for p in table] == list(model.profile_names)
    seven = next(p for p in table if p.name == "7g.80gb")
    assert (seven.slice_count, seven.placements, seven.instance_count) == (7, ((0, 8),), 1)


def test_two_backends_on_one_node_see_each_other(sim_node: SimulatedBackend) -> None:
    with SimulatedBackend.open(None, sim_node.node_dir) as other:
        other.set_mig_mode(2, True)
        sim_node.create_gpu_instance(2, "7g.80gb", 0)
        mig = other.snapshot().gpus[2].mig
        assert mig is not None and [i.profile for i in mig.instances] == ["7g.80gb"]


def _churn(node_dir: str, index: int, rounds: int) -> None:
    """Create and destroy MIG instances on GPU `index` many times, from another process."""
    with SimulatedBackend.open(None, Path(node_dir)) as backend:
        backend.set_mig_mode(index, True)
        for _ in range(rounds):
            created = [backend.create_gpu_instance(index, "1g.6gb", s) for s in range(4)]
            for instance in created:
                backend.destroy_gpu_instance(index, instance.gi_id)
        backend.create_gpu_instance(index, "4g.24gb", 0)


def test_concurrent_writers_lose_no_change(sim_node: SimulatedBackend) -> None:
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_churn, args=(str(sim_node.node_dir), index, 15)) for index in (0, 1)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    for gpu in sim_node.snapshot().gpus[:2]:
        assert gpu.mig is not None and gpu.mig.current
        assert [i.profile for i in gpu.mig.instances] == ["4g.24gb"]


@pytest.mark.parametrize("profiles", [["3g.40gb", "4g.40gb"], ["4g.40gb", "3g.40gb"]])
def test_an_inventory_mig_layout_fits_in_any_order(tmp_path: Path, profiles: list[str]) -> None:
    """What `mig check --model H100 3g.40gb:1,4g.40gb:1` accepts, the inventory accepts too."""
    inventory = tmp_path / "node.yaml"
    inventory.write_text(f"gpus:\n  - model: H100-80GB\n    mig: [{', '.join(profiles)}]\n")
    with SimulatedBackend.open(str(inventory), tmp_path / "node") as backend:
        layout = {(i.profile, i.placement_start) for i in backend.snapshot().gpus[0].mig.instances}
    assert layout == {("4g.40gb", 0), ("3g.40gb", 4)}
