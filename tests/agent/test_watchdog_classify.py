"""The watchdog's rules on scenario snapshots: whose process, what share, what counts as over."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.exempt import Exemptions, executable
from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.owners import Owners, identified
from gpupool.agent.store import Store
from gpupool.agent.watchdog import EXEMPT, KILLED, NO_JOB, OVER_SHARE, Action, Watchdog, classify
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import GiB, MiB
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot, ProcessInfo, ProcessKind

COMPUTE, GRAPHICS, BOTH = ProcessKind.COMPUTE, ProcessKind.GRAPHICS, ProcessKind.BOTH


def _gpu(index: int, *processes: tuple[int, int | None] | ProcessInfo) -> GpuSnapshot:
    """A GPU with `processes`: (pid, memory) for a compute process named "p", or as listed."""
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
        processes=tuple(
            p if isinstance(p, ProcessInfo) else ProcessInfo(p[0], "p", p[1], COMPUTE)
            for p in processes
        ),
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


def _node(*gpus: GpuSnapshot) -> NodeSnapshot:
    return NodeSnapshot(0.0, True, "sim", gpus)


def test_a_graphics_only_process_of_no_job_is_no_finding(pids: list[int]) -> None:
    display, both, own = pids
    snapshot = _node(
        _gpu(
            0,
            ProcessInfo(display, "Xorg", 300 * MiB, GRAPHICS),
            ProcessInfo(both, "glxgears", 100 * MiB, BOTH),  # a CUDA context too: a stranger
            ProcessInfo(own, "p", 3 * GiB, GRAPHICS),  # the job's own counts for its share
        )
    )
    owner = {display: None, both: None, own: 1}
    seen, findings = classify(snapshot, [_job(1, (0,), 2 * GiB)], 0, owner.get)
    assert [(f.kind, f.processes[0].pid) for f in findings] == [(NO_JOB, both), (OVER_SHARE, own)]
    assert [(p.pid, p.kind, p.job, p.stranger) for p in seen] == [
        (display, GRAPHICS, None, False),
        (both, BOTH, None, True),
        (own, GRAPHICS, 1, False),
    ]
    assert seen[0].to_json()["kind"] == "graphics"


def _sleep_path() -> str:
    """The executable a `sleep` process runs, as /proc/PID/exe shows it."""
    found = shutil.which("sleep")
    assert found is not None
    return os.path.realpath(found)


def test_an_exempt_process_of_no_job_is_an_exempt_finding(pids: list[int]) -> None:
    agent, _, job_process = pids  # `sleep` processes
    # named as the exempt agent's command, but another program: a name exempts nothing
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        snapshot = _node(
            _gpu(
                0,
                ProcessInfo(agent, "dcgm", GiB, COMPUTE),
                ProcessInfo(other.pid, "dcgm", GiB, COMPUTE),
                ProcessInfo(job_process, "dcgm", 3 * GiB, COMPUTE),
            )
        )
        owner = {agent: None, other.pid: None, job_process: 1}
        jobs = [_job(1, (0,), 2 * GiB)]
        by_path = Exemptions.parse(_sleep_path())
        seen, findings = classify(snapshot, jobs, 0, owner.get, exemptions=by_path)
        # the exemption is for processes of no job: a job's process is still held to its share
        assert [(f.kind, f.processes[0].pid) for f in findings] == [
            (EXEMPT, agent),
            (NO_JOB, other.pid),
            (OVER_SHARE, job_process),
        ]
        assert findings[0].detail() == (
            f"GPU 0: pid {agent} (dcgm) belongs to no job, 1GiB; "
            f"exempt (path {_sleep_path()}), not killed"
        )
        marks = [(p.exempt, p.stranger) for p in seen]
        assert marks == [(f"path {_sleep_path()}", False), (None, True), (None, False)]
        by_user = Exemptions.parse(f"uid:{os.getuid()}")  # the processes are this test's user's
        _, findings = classify(snapshot, jobs, 0, owner.get, exemptions=by_user)
        assert [f.kind for f in findings] == [EXEMPT, EXEMPT, OVER_SHARE]
        assert findings[1].processes[0].exempt == f"uid {os.getuid()}"
    finally:
        other.kill()
        other.wait()


def test_kill_spares_graphics_only_and_exempt_processes(tmp_path: Path) -> None:
    # the stranger runs another program than the exempt one
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    sleepers = [subprocess.Popen(argv) for argv in (["sleep", "30"], ["sleep", "30"], sleep)]
    display, exempt, stranger = (s.pid for s in sleepers)
    snapshot = _node(
        _gpu(
            0,
            ProcessInfo(display, "Xorg", 300 * MiB, GRAPHICS),
            ProcessInfo(exempt, "sleep", GiB, COMPUTE),
            ProcessInfo(stranger, "other", GiB, COMPUTE),
        )
    )
    store = Store(tmp_path / "state.db")
    exemptions = Exemptions.parse(_sleep_path())
    watchdog = Watchdog(store, Action.KILL, 0, lambda i: JobDir(tmp_path), exemptions)
    try:
        first = watchdog.check(snapshot, [])
        assert [(f.kind, f.processes[0].pid) for f in first] == [
            (EXEMPT, exempt),
            (NO_JOB, stranger),
        ]
        assert sleepers[2].wait(timeout=10) == -9
        again = watchdog.check(snapshot, [])  # the exempt one is recorded once
        assert again == [] and sleepers[0].poll() is None and sleepers[1].poll() is None
        events = store.node_events((NO_JOB, EXEMPT, KILLED), 0.0, 100)
        assert [(e["kind"], e["pid"]) for e in events] == [
            (EXEMPT, exempt),
            (NO_JOB, stranger),
            (KILLED, stranger),
        ]
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_an_exemption_list_is_paths_and_uids(tmp_path: Path) -> None:
    link = tmp_path / "agent"
    link.symlink_to(_sleep_path())
    exemptions = Exemptions.parse(f" /usr/lib/xorg/Xorg , {link},uid:0,uid:1000 ")
    # a listed link stands for the file it names, as /proc/PID/exe shows a process's executable
    paths = frozenset({"/usr/lib/xorg/Xorg", _sleep_path()})
    assert exemptions == Exemptions(paths, frozenset({0, 1000}))
    assert str(exemptions) == f"{','.join(sorted(paths))},uid:0,uid:1000"
    assert exemptions.why("/usr/lib/xorg/Xorg", 1000) == "path /usr/lib/xorg/Xorg"
    assert exemptions.why("/usr/bin/python3", 1000) == "uid 1000"
    assert exemptions.why("/usr/bin/python3", 1001) is None and exemptions.why(None, None) is None


def test_an_executable_is_what_the_kernel_says_the_process_runs() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert executable(sleeper.pid) == _sleep_path()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert executable(sleeper.pid) is None  # gone


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("uid:abc", "'uid:abc': a uid is a number"),
        ("uid:-1", "'uid:-1': a uid is a number"),
        ("uid:", "'uid:': a uid is a number"),
        ("/usr/bin/x,,uid:0", "'/usr/bin/x,,uid:0': an empty entry"),
        ("/usr/bin/x,", "'/usr/bin/x,': an empty entry"),
        (" ", "' ': an empty entry"),
        ("Xorg", "'Xorg': name the executable by its absolute path"),
        ("bin/dcgm", "'bin/dcgm': name the executable by its absolute path"),
    ],
)
def test_a_bad_exemption_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        Exemptions.parse(text)
    message = str(refused.value)
    assert message.startswith("invalid watchdog exemption ") and says in message
    assert "use comma-separated absolute executable paths and uid:N" in message
    assert "\n" not in message
