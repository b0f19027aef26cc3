"""The MIG side of the daemon on its own: a simulated node's backend and a real store."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.agent.jobs import JobSpec, MigUse, State
from gpupool.agent.migjobs import MigJobs
from gpupool.agent.store import Store
from gpupool.core.errors import DeviceError, Unschedulable
from gpupool.core.resources import Mode, Priority
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.node import SimNode
from gpupool.devices.sim.spec import parse_spec
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


def _store_and_node(tmp_path: Path, spec_yaml: str) -> Iterator[tuple[Store, SimNode]]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_yaml)
    node = SimNode.open_or_create(parse_spec(str(spec)), tmp_path / "node")
    store = Store(tmp_path / "state.db")
    yield store, node
    store.close()
    node.close()


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Store, SimNode]]:
    yield from _store_and_node(
        tmp_path, "gpus:\n  - model: H100\n    mig: [3g.40gb]\n  - model: H100\n    mig: true\n"
    )


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


# -- a blocked job is not starved by later ones ---------------------------------------------------


@pytest.fixture
def h100s(tmp_path: Path) -> Iterator[tuple[Store, SimNode]]:
    """Two H100s in MIG mode without instances."""
    yield from _store_and_node(
        tmp_path, "gpus:\n  - model: H100\n    mig: true\n  - model: H100\n    mig: true\n"
    )


def running_on(
    store: Store, node: SimNode, gpu: int, profile: str, start: int, *, created: bool = True
) -> int:
    """A job running on a new instance at `start`, made by the daemon or (not `created`) found."""
    job = store.add(JobSpec(("true",), mode=Mode.MIG, mig_profile=profile), 0, "root")
    made = node.create_instance(gpu, profile, start)
    store.start(job, (gpu,), (1,), "test")
    use = MigUse(gpu, made.gi_id, profile, start, made.uuid, 1, created=created)
    store.mig_assign(job.id, use)
    return job.id


def plan_now(store: Store, node: SimNode) -> tuple[list[tuple[int, int, str, int]], dict]:
    """(job, GPU, profile, start) of each choice of a pass over the queue, and why the rest wait."""
    backend = SimulatedBackend(node)
    migs = MigJobs(store, backend, threading.Lock(), keep=False)
    choices, waiting = migs.plan(store.jobs([State.QUEUED]), backend.snapshot())
    return [(c.job.id, c.gpu, c.profile, c.start) for c in choices], waiting


def delay_line(job_id: int) -> tuple[str]:
    return (f"it fits now, but would delay job {job_id} queued ahead of it",)


def test_a_later_job_waits_rather_than_fill_the_gpu_a_blocked_one_waits_for(
    h100s: tuple[Store, SimNode],
) -> None:
    """The 7g job waits for the 1g jobs running now on each GPU; a later 1g job would make it
    wait for one more, so it waits too. A `high` job is ahead of the `low` 7g one and starts."""
    store, node = h100s
    running_on(store, node, 0, "1g.10gb", 5)
    running_on(store, node, 1, "1g.10gb", 5)
    low = JobSpec(("true",), mode=Mode.MIG, mig_profile="7g.80gb", priority=Priority.LOW)
    whole = store.add(low, 0, "root").id
    later = store.add(replace(low, mig_profile="1g.10gb"), 0, "root").id
    urgent = mig_job(store, "1g.10gb")
    placed, waiting = plan_now(store, node)
    assert placed == [(urgent, 0, "1g.10gb", 4)]
    assert waiting[later] == delay_line(whole)
    assert waiting[whole][0].startswith("GPU 0: no free 7g.80gb instance, none can be added")


def test_a_later_job_goes_to_a_gpu_the_blocked_one_cannot_use(
    h100s: tuple[Store, SimNode],
) -> None:
    """GPU 0 would suit the 1g job best, but the 7g job waits for it; GPU 1 keeps an admin's
    3g instance (used now, not made by the daemon), so no 7g goes there ever."""
    store, node = h100s
    running_on(store, node, 0, "1g.10gb", 5)
    running_on(store, node, 1, "3g.40gb", 4, created=False)
    whole = mig_job(store, "7g.80gb")
    later = mig_job(store, "1g.10gb")
    placed, waiting = plan_now(store, node)
    assert placed == [(later, 1, "1g.10gb", 3)]
    assert list(waiting) == [whole]


def test_later_jobs_take_free_instances_and_room_the_blocked_one_can_spare(
    h100s: tuple[Store, SimNode],
) -> None:
    """The 3g job waits for the 2g job on slices 0-1 (slices 4-7 hold an admin's 1g.10gb@6,
    which stays). A 1g job takes that admin instance, free; another makes one on slice 5, beside
    where the 3g job will go; a 1g.20gb could go only on slices 2-3, its slices, and waits."""
    store, node = h100s
    running_on(store, node, 0, "2g.20gb", 0)
    node.create_instance(0, "1g.10gb", 6)
    running_on(store, node, 1, "7g.80gb", 0, created=False)  # an admin's: GPU 1 stays full
    third = mig_job(store, "3g.40gb")
    free = mig_job(store, "1g.10gb")
    beside = mig_job(store, "1g.10gb")
    slices = mig_job(store, "1g.20gb")
    placed, waiting = plan_now(store, node)
    assert placed == [(free, 0, "1g.10gb", 6), (beside, 0, "1g.10gb", 5)]
    assert waiting[slices] == delay_line(third)
    assert list(waiting) == [third, slices]


@pytest.mark.parametrize("backfilled", [False, True])
def test_jobs_started_past_a_blocked_one_count_as_staying(
    h100s: tuple[Store, SimNode], backfilled: bool
) -> None:
    """The 3g job waits for slices 0-1 (2g job); slices 4-7 hold a 2g and a 1g.20gb job. A 1g
    job could go only on slices 2-3. Had those two started before the 3g job was submitted, it
    waits for them anyway (slices 4-7 will do); started after it, past it, they count as
    staying, so slices 0-3 are its only room, and the 1g job waits: else a stream of small jobs
    on alternate halves could keep it waiting forever."""
    store, node = h100s
    running_on(store, node, 1, "7g.80gb", 0, created=False)
    running_on(store, node, 0, "2g.20gb", 0)
    third = mig_job(store, "3g.40gb") if backfilled else None
    running_on(store, node, 0, "2g.20gb", 4)
    running_on(store, node, 0, "1g.20gb", 6)
    third = third or mig_job(store, "3g.40gb")
    small = mig_job(store, "1g.10gb")
    placed, waiting = plan_now(store, node)
    if backfilled:
        assert (placed, waiting[small]) == ([], delay_line(third))
    else:
        assert [job for job, *_ in placed] == [small]
