"""MIG apply on a simulated node: plans, refusals, a failure half-way, the rerun that finishes."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.core.errors import DeviceError, MigLayoutError
from gpupool.devices.backend import DriverProfile, GpuBackend
from gpupool.devices.mig_apply import StepDone, apply_node, plan_backend, plan_node
from gpupool.devices.procfs import process_start_time
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.state import SimProcSlot
from gpupool.devices.snapshot import MigInstance, NodeSnapshot
from gpupool.mig.partedconfig import parse_config

CONFIG = parse_config(
    """\
version: v1
mig-configs:
  balanced:
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices: {"2g.12gb": 2}
  halves:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "4g.40gb": 1}
  halves-3g:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1}
  off:  # read as the name "off", not YAML 1.1's false
    - devices: all
      mig-enabled: false
""",
    "test.yaml",
)


class Wrapped(GpuBackend):
    """A simulated node behind hooks: a failing step, a pending mode, a non-simulated face."""

    def __init__(self, inner: SimulatedBackend, *, fail_on_create: int = 0) -> None:
        self.inner = inner
        self.simulated = inner.simulated
        self.fail_on_create = fail_on_create
        self.creates = 0
        self.mode_stays_pending = False

    def snapshot(self) -> NodeSnapshot:
        return self.inner.snapshot()

    def set_mig_mode(self, index: int, enabled: bool, *, force: bool = False) -> None:
        if not self.mode_stays_pending:
            self.inner.set_mig_mode(index, enabled, force=force)

    def create_gpu_instance(self, index: int, profile_name: str, start: int) -> MigInstance:
        self.creates += 1
        if self.creates == self.fail_on_create:
            raise DeviceError("Insufficient Resources (injected)")
        return self.inner.create_gpu_instance(index, profile_name, start)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self.inner.destroy_gpu_instance(index, gi_id)

    def mig_profile_table(self, index: int) -> list[DriverProfile]:
        return self.inner.mig_profile_table(index)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimulatedBackend]:
    backend = SimulatedBackend.open("2xH100-80GB,1xA30", tmp_path / "node")
    yield backend
    backend.close()


def instances(backend: GpuBackend, index: int) -> tuple[MigInstance, ...]:
    gpu = backend.snapshot().gpus[index]
    assert gpu.mig is not None
    return gpu.mig.instances


def layout(backend: GpuBackend, index: int) -> list[tuple[str, int | None]]:
    return sorted((i.profile, i.placement_start) for i in instances(backend, index))


def test_apply_reaches_the_config_on_every_matched_gpu(node: SimulatedBackend) -> None:
    done: list[StepDone] = []
    plan = apply_node(node, CONFIG, "balanced", progress=done.append)
    assert [g.index for g in plan.gpus] == [0, 1, 2]
    assert layout(node, 0) == [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert layout(node, 2) == [("2g.12gb", 0), ("2g.12gb", 2)]
    assert len(done) == 5 + 5 + 3 and done[0].step.action == "enable"
    assert not apply_node(node, CONFIG, "balanced").changes  # a rerun has nothing to do


def test_changing_config_keeps_what_can_stay(node: SimulatedBackend) -> None:
    apply_node(node, CONFIG, "balanced")
    before = {i.placement_start: i.gi_id for i in instances(node, 0)}
    plan = apply_node(node, CONFIG, "halves")
    assert plan.untouched == (1, 2)
    assert layout(node, 0) == [("3g.40gb", 4), ("4g.40gb", 0)]
    after = {i.placement_start: i.gi_id for i in instances(node, 0)}
    assert after[4] == before[4]  # the 3g.40gb at 4 was never destroyed
    assert [s.action for s in plan.gpus[0].plan.steps] == ["destroy"] * 3 + ["create"]


def test_failure_half_way_leaves_the_truth_and_a_rerun_finishes(node: SimulatedBackend) -> None:
    flaky = Wrapped(node, fail_on_create=3)
    with pytest.raises(DeviceError) as caught:
        apply_node(flaky, CONFIG, "balanced")
    message = str(caught.value)
    assert "GPU 0: step 4 of 5 (create 2g.20gb@2) failed: Insufficient Resources" in message
    assert "3 done" in message and "run the same `gpupool mig apply` again" in message
    assert isinstance(caught.value.__cause__, DeviceError)
    # what the node reports is what was done: MIG on, two instances, GPUs 1 and 2 untouched
    snapshot = node.snapshot()
    assert layout(node, 0) == [("1g.10gb", 0), ("1g.10gb", 1)]
    assert snapshot.gpus[1].mig is not None and not snapshot.gpus[1].mig.current
    first_ids = {i.gi_id for i in instances(node, 0)}
    # the second run plans from that state and keeps the two instances
    plan = apply_node(node, CONFIG, "balanced")
    assert [str(s) for s in plan.gpus[0].plan.steps] == ["create 2g.20gb@2", "create 3g.40gb@4"]
    assert layout(node, 0) == [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert first_ids <= {i.gi_id for i in instances(node, 0)}
    assert Counter(p for p, _ in layout(node, 2)) == {"2g.12gb": 2}


def _run_a_process_on(node: SimulatedBackend, index: int) -> int:
    pid = os.getpid()
    start = process_start_time(pid)
    assert start is not None
    node.node.state.write_proc(0, SimProcSlot(0, pid, index, start, 1 << 30, 0, 0))
    return pid


def test_running_processes_block_destroys_unless_forced(node: SimulatedBackend) -> None:
    apply_node(node, CONFIG, "balanced")
    pid = _run_a_process_on(node, 0)
    plan = plan_node(node.snapshot(), CONFIG, "halves")
    assert plan.gpus[0].blocking_pids == (pid,)
    with pytest.raises(DeviceError, match=rf"GPU 0 runs {pid}.*use --force"):
        apply_node(node, CONFIG, "halves")
    assert len(layout(node, 0)) == 4  # refused before touching anything
    apply_node(node, CONFIG, "halves", force=True)
    assert layout(node, 0) == [("3g.40gb", 4), ("4g.40gb", 0)]


def test_creating_next_to_running_processes_is_allowed(node: SimulatedBackend) -> None:
    apply_node(node, CONFIG, "halves")
    node.destroy_gpu_instance(0, instances(node, 0)[0].gi_id)
    _run_a_process_on(node, 0)
    plan = apply_node(node, CONFIG, "halves")
    assert [s.action for s in plan.gpus[0].plan.steps] == ["create"]
    assert plan.gpus[0].blocking_pids == ()


def test_real_gpus_need_root(node: SimulatedBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Wrapped(node)
    real.simulated = False
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(DeviceError, match="needs root: run it again with sudo"):
        apply_node(real, CONFIG, "balanced")
    assert layout(node, 0) == []
    plan_node(real.snapshot(), CONFIG, "balanced")  # planning needs no root
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    apply_node(real, CONFIG, "balanced")
    assert len(layout(node, 0)) == 4


def test_a_pending_mode_change_says_reset(node: SimulatedBackend) -> None:
    pending = Wrapped(node)
    pending.mode_stays_pending = True
    with pytest.raises(DeviceError, match=r"MIG mode on is pending until GPU 0 is reset"):
        apply_node(pending, CONFIG, "balanced")


def test_disable_destroys_first(node: SimulatedBackend) -> None:
    apply_node(node, CONFIG, "balanced")
    plan = apply_node(node, CONFIG, "off")
    assert [s.action for s in plan.gpus[2].plan.steps] == ["destroy", "destroy", "disable"]
    assert all(g.mig is not None and not g.mig.current for g in node.snapshot().gpus)


def test_a_lost_gpu_is_named(node: SimulatedBackend) -> None:
    node.node.state.set_flags(1, 0x1)
    with pytest.raises(DeviceError, match="GPU 1 cannot be configured: GPU is lost"):
        plan_node(node.snapshot(), CONFIG, "balanced")


class DriverSays(Wrapped):
    """A real-looking node whose driver table differs from the catalog."""

    def __init__(self, inner: SimulatedBackend, table: list[DriverProfile]) -> None:
        super().__init__(inner)
        self.simulated = False
        self.table = table

    def mig_profile_table(self, index: int) -> list[DriverProfile]:
        return self.table if index == 0 else self.inner.mig_profile_table(index)


def test_on_real_gpus_the_drivers_table_decides(node: SimulatedBackend) -> None:
    only_high = [DriverProfile(9, "3g.40gb", 40448, 3, 60, 2, ((4, 4),))]
    plan = plan_backend(DriverSays(node, only_high), CONFIG, "halves-3g")
    assert [str(p) for p in plan.gpus[0].plan.final] == ["3g.40gb@4"]
    with pytest.raises(MigLayoutError, match=r"GPU 0 \(H100-80GB\): its driver does not offer"):
        plan_backend(DriverSays(node, only_high), CONFIG, "balanced")
