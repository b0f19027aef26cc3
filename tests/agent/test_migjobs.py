"""The MIG side of the daemon on its own: a simulated node's backend and a real store."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.agent.jobs import JobSpec
from gpupool.agent.migjobs import MigJobs
from gpupool.agent.store import Store
from gpupool.core.errors import DeviceError, Unschedulable
from gpupool.core.resources import Mode
from gpupool.devices.simnode import SimNode
from gpupool.devices.simspec import parse_spec
from gpupool.devices.simulated import SimulatedBackend
from gpupool.devices.snapshot import MigInstance, NodeSnapshot


class HalfMade(SimulatedBackend):
    """A driver that makes the GPU instance, then fails on its compute instance."""

    def create_gpu_instance(self, index: int, profile_name: str, start: int) -> MigInstance:
        super().create_gpu_instance(index, profile_name, start)
        raise DeviceError("nvmlGpuInstanceCreateComputeInstance: Insufficient Resources")


class NoUuidAtCreation(SimulatedBackend):
    """As NVML: the created instance comes back without its UUID (the MIG device has it)."""

    def create_gpu_instance(self, index: int, profile_name: str, start: int) -> MigInstance:
        return replace(super().create_gpu_instance(index, profile_name, start), uuid=None)


class NotRoot(SimulatedBackend):
    """As NVML answers a daemon that is not root: instances without their placements."""

    def snapshot(self) -> NodeSnapshot:
        taken = super().snapshot()
        gpus = []
        for gpu in taken.gpus:
            assert gpu.mig is not None
            hidden = tuple(replace(i, placement_start=None) for i in gpu.mig.instances)
            gpus.append(replace(gpu, mig=replace(gpu.mig, instances=hidden)))
        return replace(taken, gpus=tuple(gpus))


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Store, SimNode]]:
    spec = tmp_path / "spec.yaml"
    spec.write_text("gpus:\n  - model: H100\n    mig: [3g.40gb]\n  - model: H100\n    mig: true\n")
    node = SimNode.open_or_create(parse_spec(str(spec)), tmp_path / "node")
    store = Store(tmp_path / "state.db")
    yield store, node
    store.close()
    node.close()


def mig_job(store: Store, profile: str) -> int:
    spec = JobSpec(("true",), mode=Mode.MIG, mig_profile=profile)
    return store.add(spec, 0, "root").id


def test_a_half_made_instance_is_destroyed_and_nothing_is_noted(
    parts: tuple[Store, SimNode],
) -> None:
    store, node = parts
    migs = MigJobs(store, HalfMade(node), threading.Lock(), keep=False)
    job_id = mig_job(store, "1g.10gb")
    (choice,), waiting = migs.plan(store.jobs(), HalfMade(node).snapshot())
    assert waiting == {}
    with pytest.raises(DeviceError, match="Insufficient Resources"):
        migs.acquire(choice)
    assert [i.profile for g in node.gpus() for i in g.instances] == ["3g.40gb"]
    assert store.mig_rows() == [] and job_id == choice.job.id


def test_one_pass_places_jobs_around_each_other(parts: tuple[Store, SimNode]) -> None:
    """Within a pass, each choice sees the ones before it: a free instance once, new instances
    on slices left free, and the rest wait with a reason per GPU."""
    store, node = parts
    backend = SimulatedBackend(node)
    for profile in ("3g.40gb", "3g.40gb", "4g.40gb", "4g.40gb", "7g.80gb"):
        mig_job(store, profile)
    choices, waiting = MigJobs(store, backend, threading.Lock(), keep=False).plan(
        store.jobs(), backend.snapshot()
    )
    placed = [(c.gpu, c.profile, c.start, c.existing is not None) for c in choices]
    assert placed == [
        (0, "3g.40gb", 4, True),  # the free one
        (1, "3g.40gb", 4, False),  # where it strands nothing and leaves the most room
        (0, "4g.40gb", 0, False),
        (1, "4g.40gb", 0, False),
    ]
    (why,) = waiting.values()
    full = "no free 7g.80gb instance, none can be added: 0 compute slices free, 7g.80gb needs 7"
    assert why == (f"GPU 0: {full}", f"GPU 1: {full}")


def test_release_destroys_only_the_instance_it_made(parts: tuple[Store, SimNode]) -> None:
    """A daemon killed after destroying a job's instance but before noting it: at restart the
    GPU instance id may already name another instance, which must stay."""
    store, node = parts
    backend = SimulatedBackend(node)
    migs = MigJobs(store, backend, threading.Lock(), keep=False)
    job_id = mig_job(store, "1g.10gb")
    (choice,), _ = migs.plan(store.jobs(), backend.snapshot())
    use = migs.acquire(choice)
    node.destroy_instance(use.gpu, use.gi_id)  # the last daemon's destroy
    other = node.create_instance(use.gpu, "1g.10gb", use.start)  # someone else's, same id
    assert other.gi_id == use.gi_id
    assert migs.recover() == [(job_id, f"{use.label} already gone")]
    assert other.uuid in {i.uuid for i in node.gpu(use.gpu).instances}
    assert store.mig_rows() == []


def test_a_new_instance_s_uuid_is_read_from_the_gpu(parts: tuple[Store, SimNode]) -> None:
    store, node = parts
    backend = NoUuidAtCreation(node)
    migs = MigJobs(store, backend, threading.Lock(), keep=False)
    mig_job(store, "2g.20gb")
    (choice,), _ = migs.plan(store.jobs(), backend.snapshot())
    use = migs.acquire(choice)
    made = next(i for i in node.gpu(use.gpu).instances if i.gi_id == use.gi_id)
    assert (use.uuid, use.created) == (made.uuid, True)


def test_without_root_only_existing_instances_serve(parts: tuple[Store, SimNode]) -> None:
    store, node = parts
    node.create_instance(1, "1g.10gb", 0)  # an instance on each GPU, none where NVML says
    backend = NotRoot(node)
    migs = MigJobs(store, backend, threading.Lock(), keep=False)
    spec = JobSpec(("true",), mode=Mode.MIG, mig_profile="3G.40GB")
    assert migs.check_submit(spec, backend.snapshot()).mig_profile == "3g.40gb"
    with pytest.raises(Unschedulable, match="GPU 1: its layout is unknown"):
        migs.check_submit(replace(spec, mig_profile="2g.20gb"), backend.snapshot())
