"""The queue rule on its own: priority, first come first served, backfill that delays no one."""

from __future__ import annotations

from typing import Any

from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.node import free_now
from gpupool.agent.queue import plan
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import GiB
from gpupool.scheduler.gpus import GpuView


def job(
    job_id: int,
    compute: int,
    *,
    at: float = 0.0,
    gpus: tuple[int, ...] = (),
    priority: Priority = Priority.HIGH,
) -> Job:
    spec = JobSpec(("true",), compute=compute, memory="1GiB", priority=priority)
    state = State.RUNNING if gpus else State.QUEUED
    return Job(
        job_id, spec, 0, "u", state, at, gpus, (GiB,) * len(gpus), started_at=at if gpus else None
    )


def node() -> tuple[GpuView, ...]:
    return (GpuView.idle(0, "A100", 40 * GiB),)


def free(running: list[Job]) -> tuple[GpuView, ...]:
    return free_now(node(), running)


def test_fitting_jobs_start_in_order() -> None:
    queued = [job(1, 300, at=1), job(2, 300, at=2), job(3, 500, at=3)]
    result = plan(queued, [], free([]), node(), "binpack")
    assert [s.job.id for s in result.starts] == [1, 2]
    assert result.waiting[3] == (
        "GPU 0: compute 50% needed, 40% free",
        "1 GPU needed, 0 can take the share now",
    )


def test_backfill_only_where_the_head_still_fits_after() -> None:
    running = [job(1, 500, at=0, gpus=(0,))]
    head, small, greedy = job(2, 600, at=1), job(3, 200, at=2), job(4, 250, at=3)
    result = plan([head, small, greedy], running, free(running), node(), "binpack")
    assert [(s.job.id, s.backfill) for s in result.starts] == [(3, True)]
    assert result.waiting[4] == ("it fits now, but would delay job 2 queued ahead of it",)
    # next pass: the backfilled job runs now, and still counts against the head
    running.append(job(3, 200, at=5, gpus=(0,)))
    again = plan([head, greedy], running, free(running), node(), "binpack")
    assert again.starts == () and 4 in again.waiting


def test_without_a_blocked_head_nothing_is_held_back() -> None:
    running = [job(1, 500, at=0, gpus=(0,))]
    result = plan([job(2, 250, at=1), job(3, 250, at=2)], running, free(running), node(), "binpack")
    assert [(s.job.id, s.backfill) for s in result.starts] == [(2, False), (3, False)]


def test_an_exclusive_job_is_admitted_the_whole_gpu_and_leaves_no_room() -> None:
    reserve = GiB
    capacity = (GpuView.idle(0, "A100", 39 * GiB),)  # a 40 GiB GPU less one context reserve
    spec = JobSpec(("true",), mode=Mode.EXCLUSIVE)
    whole = Job(1, spec, 0, "u", State.QUEUED, 1.0)
    result = plan([whole, job(2, 10, at=2)], [], capacity, capacity, "binpack", reserve=reserve)
    assert [(s.job.id, s.memory) for s in result.starts] == [(1, (40 * GiB,))]
    running = [Job(1, spec, 0, "u", State.RUNNING, 1.0, (0,), (40 * GiB,), started_at=1.0)]
    (gpu,) = free_now(capacity, running, reserve)
    assert (gpu.memory_free, gpu.compute_free) == (0, 0)


def test_a_low_job_holds_no_compute_and_runs_beside_a_guaranteed_one() -> None:
    running = [job(1, 1000, at=0, gpus=(0,))]
    result = plan(
        [job(2, 500, at=1, priority=Priority.LOW)], running, free(running), node(), "binpack"
    )
    assert [s.job.id for s in result.starts] == [2]
    running.append(job(2, 500, at=1, gpus=(0,), priority=Priority.LOW))
    (gpu,) = free(running)
    assert (gpu.compute_free, gpu.memory_free) == (0, 38 * GiB)


def test_a_guaranteed_job_is_not_held_back_by_a_low_jobs_compute() -> None:
    running = [job(1, 1000, at=0, gpus=(0,), priority=Priority.LOW)]
    result = plan([job(2, 1000, at=1)], running, free(running), node(), "binpack")
    assert [s.job.id for s in result.starts] == [2]


def test_a_low_job_still_needs_its_memory() -> None:
    big = JobSpec(("true",), compute=100, memory="39GiB")
    running = [Job(1, big, 0, "u", State.RUNNING, 0.0, (0,), (39 * GiB,), started_at=0.0)]
    low = JobSpec(("true",), compute=100, memory="2GiB", priority=Priority.LOW)
    queued = [Job(2, low, 0, "u", State.QUEUED, 1.0)]
    result = plan(queued, running, free(running), node(), "binpack")
    assert result.starts == ()
    assert result.waiting[2][0] == "GPU 0: memory 2GiB needed, 1GiB free"


def test_a_low_job_backfills_beside_a_head_that_waits_for_compute() -> None:
    running = [job(1, 500, at=0, gpus=(0,))]
    head, low = job(2, 600, at=1), job(3, 800, at=2, priority=Priority.LOW)
    result = plan([head, low], running, free(running), node(), "binpack")
    assert [(s.job.id, s.backfill) for s in result.starts] == [(3, True)]
    assert result.waiting[2] == (
        "GPU 0: compute 60% needed, 50% free",
        "1 GPU needed, 0 can take the share now",
    )


def test_jobs_of_one_spread_group_take_different_gpus_and_others_pack() -> None:
    gpus = (GpuView.idle(0, "A100", 40 * GiB), GpuView.idle(1, "A100", 40 * GiB))

    def member(job_id: int, group: str, on: tuple[int, ...] = ()) -> Job:
        spec = JobSpec(("true",), compute=200, memory="1GiB", spread_group=group)
        state = State.RUNNING if on else State.QUEUED
        return Job(job_id, spec, 0, "u", state, job_id, on, (GiB,) * len(on))

    queued = [member(1, "service/a"), member(2, "service/a"), member(3, ""), member(4, "")]
    result = plan(queued, [], gpus, gpus, "binpack")
    assert {s.job.id: s.gpus for s in result.starts} == {1: (0,), 2: (1,), 3: (0,), 4: (0,)}
    # a replica already running counts: the next one leaves the fuller GPU it is on
    running = [member(1, "service/a", (0,)), member(5, "service/b", (0,))]
    running.append(member(7, "service/b", (1,)))
    again = plan([member(6, "service/a")], running, free_now(gpus, running), gpus, "binpack")
    assert again.starts[0].gpus == (1,)
    # stored and read back, the group is kept (a restarted daemon still spreads)
    assert JobSpec.from_json(queued[0].spec.to_json()).spread_group == "service/a"


def test_the_spread_gives_way_where_it_would_delay_a_blocked_job() -> None:
    gpus = (GpuView.idle(0, "A", 40 * GiB), GpuView.idle(1, "B", 40 * GiB))

    def one(job_id: int, compute: int, on: tuple[int, ...] = (), **spec: Any) -> Job:
        state = State.RUNNING if on else State.QUEUED
        share = JobSpec(("true",), compute=compute, memory="1GiB", **spec)
        return Job(job_id, share, 0, "u", state, job_id, on, (GiB,) * len(on), started_at=0.0)

    running = [one(1, 200, (0,), spread_group="s"), one(2, 300, (0,)), one(3, 400, (1,))]
    head = one(4, 800, gpu_models=("B",))  # waits for GPU 1, the only one it may use
    replica = one(5, 300, spread_group="s")
    result = plan([head, replica], running, free_now(gpus, running), gpus, "binpack")
    # spread, the replica would take GPU 1 and delay the head: it packs on GPU 0 instead
    assert [(s.job.id, s.gpus) for s in result.starts] == [(5, (0,))]
    assert 4 in result.waiting


def test_an_mps_job_skips_another_users_server_and_says_whose_it_waits_for() -> None:
    gpus = (GpuView.idle(0, "A100", 40 * GiB), GpuView.idle(1, "A100", 40 * GiB))
    spec = JobSpec(("true",), compute=300, memory="1GiB", mode=Mode.MPS)
    roots = Job(1, spec, 0, "root", State.RUNNING, 0, (0,), (GiB,), started_at=0)
    bobs, carols = (Job(n, spec, 1000 + n, f"u{n}", State.QUEUED, n, (), ()) for n in (2, 3))
    roots_next = Job(4, spec, 0, "root", State.QUEUED, 4, (), ())
    result = plan([bobs, carols, roots_next], [roots], free_now(gpus, [roots]), gpus, "binpack")
    # binpack would put bob beside root on GPU 0; root's next one joins its own server there
    assert [(s.job.id, s.gpus) for s in result.starts] == [(2, (1,)), (4, (0,))]
    assert result.waiting[3] == (
        "GPU 0's MPS server serves uid 0 until their MPS jobs there end",
        "GPU 1's MPS server serves uid 1002 until their MPS jobs there end",
    )


def test_a_node_whose_gpus_are_all_set_aside_leaves_the_job_waiting_with_a_reason() -> None:
    # the queue loop hands plan no GPU when every one is in MIG mode
    result = plan([job(1, 300)], [], (), (), "binpack")
    assert result.starts == ()
    assert result.waiting[1] == ("1 GPU needed, 0 can take the share now",)
