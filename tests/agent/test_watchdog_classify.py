"""The watchdog's rules on scenario snapshots: whose process, what share, what counts as over."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.owners import Owners, identified
from gpupool.agent.store import Store
from gpupool.agent.watchdog import NO_JOB, OVER_SHARE, Action, Watchdog, classify
from gpupool.core.units import GiB, MiB
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot, ProcessInfo


def _gpu(index: int, *processes: tuple[int, int | None]) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        uuid=f"GPU-{index}",
        name="sim",
        model="A30",
        pci_bus_id="",
        memory_total=24 * GiB,
        memory_used=0,
        memory_free=24 * GiB,
        utilization=None,
        temperature=None,
        power_w=None,
        mig=None,
        processes=tuple(ProcessInfo(pid, "p", memory) for pid, memory in processes),
    )


def _job(job_id: int, gpus: tuple[int, ...], share: int) -> Job:
    return Job(
        job_id,
        JobSpec(("true",)),
        0,
        "u",
        State.RUNNING,
        0.0,
        gpus=gpus,
        memory=tuple(share for _ in gpus),
    )


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Three live processes (the watchdog skips pids that are gone)."""
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    yield [s.pid for s in sleepers]
    for sleeper in sleepers:
        sleeper.kill()
        sleeper.wait()


def test_a_share_is_per_gpu_with_one_context_reserve_per_process(pids: list[int]) -> None:
    a, b, c = pids
    owner = {a: 1, b: 1, c: None}
    snapshot = NodeSnapshot(
        0.0,
        True,
        "sim",
        (
            _gpu(0, (a, 2 * GiB + 512 * MiB), (b, 512 * MiB)),  # 3 GiB: within 2 GiB + 2 x 512
            _gpu(1, (a, 600 * MiB), (c, None)),  # a GPU job 1 was not placed on: share 0
        ),
    )
    seen, findings = classify(snapshot, [_job(1, (0,), 2 * GiB)], 512 * MiB, owner.get)
    assert [(f.kind, f.gpu, f.job, f.memory, f.allowed) for f in findings] == [
        (NO_JOB, 1, None, 0, 0),
        (OVER_SHARE, 1, 1, 600 * MiB, 512 * MiB),
    ]
    assert findings[0].detail() == f"GPU 1: pid {c} (p) belongs to no job, memory unknown"
    assert [(p.gpu, p.pid, p.job, p.share, p.over_share) for p in seen] == [
        (0, a, 1, 2 * GiB, False),
        (0, b, 1, 2 * GiB, False),
        (1, c, None, None, False),
        (1, a, 1, 0, True),
    ]
    tighter, _ = classify(snapshot, [_job(1, (0, 1), 2 * GiB)], 0, owner.get)
    assert [p.over_share for p in tighter if p.gpu == 0] == [True, True]  # 3 GiB > 2 GiB


def test_gone_and_ignored_processes_are_skipped(pids: list[int]) -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    snapshot = NodeSnapshot(0.0, True, "sim", (_gpu(0, (done.pid, GiB), (pids[0], GiB)),))
    seen, findings = classify(snapshot, [], 0, lambda pid: None, frozenset({pids[0]}))
    assert seen == [] and findings == []


def test_owners_by_group_session_and_parent() -> None:
    job = _job(7, (0,), GiB)
    leader = subprocess.Popen(["sleep", "30"], start_new_session=True)  # group and session
    try:
        ours = Owners([Job(**{**job.__dict__, "job_pid": leader.pid})])
        assert ours.job_of(leader.pid) == 7
        by_session = Owners([Job(**{**job.__dict__, "supervisor_pid": leader.pid})])
        assert by_session.job_of(leader.pid) == 7
        # this test's own process descends from no job
        assert ours.job_of(os.getpid()) is None
        assert Owners([]).job_of(leader.pid) is None
    finally:
        leader.kill()
        leader.wait()


def test_a_job_just_launched_is_known_by_its_directory(tmp_path: Path) -> None:
    # the store learns a job's pids on the loop's next pass; its processes may be on a GPU first
    job = _job(7, (0,), GiB)
    leader = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        directory = JobDir(tmp_path / "7")
        assert identified(job, lambda _: directory).supervisor_pid is None
        assert directory.claim()
        (directory.path / "claim").write_text(str(leader.pid))  # what the supervisor writes
        assert Owners([identified(job, lambda _: directory)]).job_of(leader.pid) == 7
        (directory.path / "pids.json").write_text(
            json.dumps({"supervisor": 1, "supervisor_start": 0, "job": leader.pid, "job_start": 0})
        )
        known = identified(job, lambda _: directory)
        assert (known.job_pid, known.supervisor_pid) == (leader.pid, 1)
    finally:
        leader.kill()
        leader.wait()


def test_the_daemons_own_mps_servers_are_never_strangers(tmp_path: Path, pids: list[int]) -> None:
    server, stranger = pids[0], pids[1]
    snapshot = NodeSnapshot(0.0, True, "sim", (_gpu(0, (server, 300 * MiB), (stranger, GiB)),))
    watchdog = Watchdog(Store(tmp_path / "state.db"), Action.REPORT, 0, lambda i: JobDir(tmp_path))
    found = watchdog.check(snapshot, [], helpers={server})
    assert [(f.kind, f.processes[0].pid) for f in found] == [(NO_JOB, stranger)]
