"""Elastic memory through a real daemon on a simulated node, with real jobs: suspend and resume
(data and addresses checked by the job itself), preemption by suspension and the resume order,
a low job's burst sent to host memory for a high job, resize, and the job or the daemon killed
while a job is suspended."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.agent.conftest import _kill_jobs, serving
from tests.agent.daemon_support import Daemon, cli, scrape, until

from gpupool.agent.arbiters import NodeArbiter
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import GiB
from gpupool.devices.sim.state import STATE_FILE, SimState
from gpupool.isolation import elastic
from gpupool.isolation.arbiter import find_share
from gpupool.isolation.arbiter_control import node_arbiter_dir
from gpupool.isolation.launch import find_shared_region

JOB = str(Path(__file__).resolve().parents[2] / "examples" / "elastic_job.py")


def run_job(daemon: Daemon, seconds: float, hold_mib: int, burst_mib: int = 0, **share: Any) -> int:
    argv = [sys.executable, JOB, str(seconds), str(hold_mib)]
    return daemon.submit(argv + ([str(burst_mib)] if burst_mib else []), **share)


def output(daemon: Daemon, job: int) -> str:
    path = daemon.state_dir / "jobs" / str(job) / "stdout"
    return path.read_text() if path.exists() else ""


def holding(daemon: Daemon, job: int) -> None:
    assert until(lambda: "holding" in output(daemon, job)), output(daemon, job)


def elastic_state(daemon: Daemon, job: int) -> str:
    shown = daemon.job(job).get("elastic")
    return "running" if shown is None else str(shown["state"])


def gpu_used(daemon: Daemon, gpu: int = 0) -> int:
    state = SimState.open(daemon.node_dir / "state.bin")
    try:
        return state.gpu(gpu).memory_used
    finally:
        state.close()


def kinds(daemon: Daemon, job: int) -> list[str]:
    return [event["kind"] for event in daemon.job(job)["events"]]


@pytest.fixture
def one_gpu(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "1xA100-40GB", "--preempt", "suspend")


def test_suspend_frees_the_gpu_and_resume_brings_the_data_back(daemon: Daemon) -> None:
    # long enough to be running still after every step below on a loaded machine
    job = run_job(daemon, 8, 8192, memory="10Gi")
    holding(daemon, job)
    assert gpu_used(daemon) == 8 * GiB
    done = cli("suspend", str(job), url=daemon.url)
    assert done.returncode == 0, done.stderr
    assert until(lambda: elastic_state(daemon, job) == "suspended", 10)
    assert gpu_used(daemon) == 0  # the GPU shows it free
    shown = daemon.job(job)["elastic"]
    assert shown["host_bytes"] == 8 * GiB
    assert " suspended " in cli("ps", url=daemon.url).stdout
    gpus = cli("gpus", "--node-dir", str(daemon.node_dir), url=daemon.url).stdout
    assert f"job {job} (" in gpus and "suspended, 8GiB in host memory" in gpus
    metrics = scrape(daemon)
    assert [v for _, v in metrics["gpupool_job_suspended"]] == [1]
    assert [v for _, v in metrics["gpupool_job_host_memory_bytes"]] == [8 * GiB]
    # admission counts it free: a job that needs the whole GPU starts beside it
    whole = run_job(daemon, 0.2, 1024, memory="40Gi")
    assert daemon.wait(whole)["state"] == "succeeded"
    # suspended twice, resumed while running: one line each, nothing changed
    again = cli("suspend", str(job), url=daemon.url)
    assert again.returncode != 0 and "already suspended" in again.stderr
    assert cli("resume", str(job), url=daemon.url).returncode == 0
    assert until(lambda: elastic_state(daemon, job) == "running", 10)
    assert gpu_used(daemon) == 8 * GiB
    not_suspended = cli("resume", str(job), url=daemon.url)
    assert not_suspended.returncode != 0 and "is not suspended" in not_suspended.stderr
    assert daemon.wait(job)["state"] == "succeeded", output(daemon, job)
    assert "intact after" in output(daemon, job)
    assert kinds(daemon, job)[-5:-1] == ["suspended", "resume", "resuming", "resumed"]
    finished = cli("suspend", str(job), url=daemon.url)
    assert finished.returncode != 0 and "only a running job" in finished.stderr


def test_preemption_suspends_low_jobs_and_resumes_them_in_order(one_gpu: Daemon) -> None:
    first = run_job(one_gpu, 5, 12 * 1024, memory="16Gi", priority="low")
    second = run_job(one_gpu, 5, 12 * 1024, memory="16Gi", priority="low")
    holding(one_gpu, first)
    holding(one_gpu, second)
    high = run_job(one_gpu, 1.5, 28 * 1024, memory="30Gi")
    # both low jobs must go for 30 GiB: the newest first, then the other
    assert one_gpu.wait(high)["state"] == "succeeded", output(one_gpu, high)
    for low in (first, second):
        assert "preempted by job" in " ".join(e["detail"] for e in one_gpu.job(low)["events"])
        assert one_gpu.wait(low)["state"] == "succeeded", output(one_gpu, low)
        assert "intact after" in output(one_gpu, low)

    def resumed_at(job: int) -> float:
        return next(e["at"] for e in one_gpu.job(job)["events"] if e["kind"] == "resuming")

    assert resumed_at(first) <= resumed_at(second)  # in queue order


def test_a_burst_goes_to_host_memory_for_a_high_job(one_gpu: Daemon) -> None:
    low = run_job(one_gpu, 6, 7 * 1024, 20 * 1024, memory="8Gi", memory_burst="24Gi",
                  priority="low")  # fmt: skip
    assert until(lambda: "burst 20480 MiB: ok" in output(one_gpu, low)), output(one_gpu, low)
    assert until(lambda: gpu_used(one_gpu) == 27 * GiB)  # the GPU had room: the burst is on it

    def burst() -> dict[str, float]:
        return {labels["where"]: v for labels, v in scrape(one_gpu)["gpupool_job_burst_bytes"]}

    assert until(lambda: burst() == {"gpu": 20 * GiB, "host": 0}), burst()
    high = run_job(one_gpu, 1, 31 * 1024, memory="32Gi")
    assert one_gpu.wait(high)["state"] == "succeeded", output(one_gpu, high)  # never refused
    assert "holding 31744 MiB" in output(one_gpu, high)
    assert one_gpu.wait(low)["state"] == "succeeded", output(one_gpu, low)
    assert "intact after" in output(one_gpu, low)
    refused = cli(
        "submit", "--memory", "8Gi", "--memory-burst", "8Gi", "--", "true", url=one_gpu.url
    )
    assert refused.returncode == 2 and "low-priority" in refused.stderr


def arbiter_percent(daemon: Daemon, job: int) -> int | None:
    """The job's share's weight in the node arbiter's view of GPU 0."""
    arbiter = NodeArbiter(node_arbiter_dir(daemon.node_dir), daemon.state_dir)
    state = SimState.open(daemon.node_dir / STATE_FILE)
    uuid = state.gpu(0).uuid
    state.close()
    found = find_share(arbiter.directory, uuid, arbiter.share_of(f"job {job}").share_id)
    return found.percent if found is not None else None


def test_resize_up_down_and_refused(daemon: Daemon) -> None:
    job = run_job(daemon, 5, 4096, memory="8Gi", compute=20)
    holding(daemon, job)
    region = find_shared_region(daemon.state_dir / "jobs" / str(job))
    assert region is not None
    grown = cli("resize", str(job), "--memory", "16Gi", "--compute", "60", url=daemon.url)
    assert grown.returncode == 0, grown.stderr
    assert "memory 8GiB -> 16GiB, compute 20% -> 60%" in grown.stdout
    state = elastic.read(region)
    assert state is not None
    assert (state.memory_limit[0], state.compute_limit[0]) == (16 * GiB, 60)
    assert daemon.job(job)["memory"] == 16 * GiB
    assert arbiter_percent(daemon, job) == 60  # its weight against other shares, too
    shrunk = cli("resize", str(job), "--memory", "6Gi", url=daemon.url)
    assert shrunk.returncode == 0, shrunk.stderr
    below = cli("resize", str(job), "--memory", "2Gi", url=daemon.url)
    assert below.returncode != 0
    assert "holds 4GiB on GPU" in below.stderr and "free 2GiB first" in below.stderr
    too_big = cli("resize", str(job), "--memory", "41Gi", url=daemon.url)
    assert too_big.returncode != 0 and "cannot grow to 41GiB" in too_big.stderr
    for bad in (("--memory", "lots"), ("--compute", "0"), ()):
        answer = cli("resize", str(job), *bad, url=daemon.url)
        assert answer.returncode == 2 and answer.stderr.count("\n") == 1, answer.stderr
    state = elastic.read(region)
    assert state is not None and state.memory_limit[0] == 6 * GiB  # nothing changed
    assert daemon.wait(job)["state"] == "succeeded"


def test_shrinking_below_what_a_job_holds_spills_into_its_burst(daemon: Daemon) -> None:
    low = {"memory": "8Gi", "priority": "low"}
    roomy = run_job(daemon, 4, 6 * 1024, memory_burst="8Gi", **low)
    tight = run_job(daemon, 4, 6 * 1024, memory_burst="2Gi", **low)
    holding(daemon, roomy)
    holding(daemon, tight)
    done = cli("resize", str(roomy), "--memory", "4Gi", url=daemon.url)
    assert done.returncode == 0, done.stderr
    assert "memory 8GiB -> 4GiB (2GiB spills into its burst)" in done.stdout
    region = find_shared_region(daemon.state_dir / "jobs" / str(roomy))
    assert region is not None

    def spilled() -> bool:
        state = elastic.read(region)  # whole allocations move: its one 6 GiB
        return state is not None and (state.used[0], state.burst_used[0]) == (0, 6 * GiB)

    assert until(spilled, 5)
    refused = cli("resize", str(tight), "--memory", "2Gi", url=daemon.url)
    assert refused.returncode != 0
    assert "its burst has 2GiB left for the 4GiB past it" in refused.stderr
    for job in (roomy, tight):
        assert daemon.wait(job)["state"] == "succeeded" and "intact" in output(daemon, job)


def test_a_resume_without_room_waits_and_says_why(one_gpu: Daemon) -> None:
    first = run_job(one_gpu, 6, 20 * 1024, memory="30Gi")
    holding(one_gpu, first)
    assert cli("suspend", str(first), url=one_gpu.url).returncode == 0
    assert until(lambda: elastic_state(one_gpu, first) == "suspended", 10)
    second = run_job(one_gpu, 2, 1024, memory="30Gi")  # fits in the room the first one left
    holding(one_gpu, second)
    assert cli("resume", str(first), url=one_gpu.url).returncode == 0
    why = until(lambda: (one_gpu.job(first)["elastic"] or {}).get("waiting"))
    assert why == ["waiting to resume: GPU 0 has 10GiB free for shares, it needs 30GiB back"]
    assert (
        "waiting to resume: GPU 0 has 10GiB free"
        in cli("describe", str(first), url=one_gpu.url).stdout
    )
    again = cli("resume", str(first), url=one_gpu.url)
    assert again.returncode != 0 and "already waits to resume" in again.stderr
    assert one_gpu.wait(second)["state"] == "succeeded"
    assert until(lambda: elastic_state(one_gpu, first) == "running", 10)
    assert one_gpu.wait(first)["state"] == "succeeded" and "intact" in output(one_gpu, first)
    with pytest.raises(InvalidRequest, match="--memory-burst is for low-priority jobs"):
        one_gpu.call("POST", "/v1/jobs", json={"argv": ["true"], "memory_burst": "8Gi"})
    with pytest.raises(InvalidRequest, match="invalid compute share"):
        one_gpu.call("POST", f"/v1/jobs/{first}/resize", json={"compute": 0})


def test_resize_and_suspend_of_an_mps_job_are_refused(daemon: Daemon) -> None:
    job = run_job(daemon, 4, 256, memory="4Gi", compute=50, mode="mps")
    holding(daemon, job)
    resized = cli("resize", str(job), "--compute", "60", url=daemon.url)
    assert resized.returncode != 0
    assert "MPS cannot change a running client's active thread percentage" in resized.stderr
    suspended = cli("suspend", str(job), url=daemon.url)
    assert suspended.returncode != 0 and "only mode shim jobs" in suspended.stderr
    daemon.call("POST", f"/v1/jobs/{job}/cancel", json={})


def test_a_job_killed_while_suspended_ends_and_leaves_nothing(daemon: Daemon) -> None:
    job = run_job(daemon, 30, 4096, memory="8Gi")
    holding(daemon, job)
    assert cli("suspend", str(job), url=daemon.url).returncode == 0
    assert until(lambda: elastic_state(daemon, job) == "suspended", 10)
    pids = daemon.state_dir / "jobs" / str(job) / "pids.json"
    job_pid = int(json.loads(pids.read_text())["job"])
    os.killpg(job_pid, signal.SIGKILL)
    assert daemon.wait(job)["state"] == "failed"
    assert until(lambda: not Path(f"/proc/{job_pid}").exists())  # its host memory went with it
    assert gpu_used(daemon) == 0
    assert until(lambda: daemon.job(job).get("elastic") is None)


def test_a_daemon_killed_while_a_job_is_suspended_adopts_it(tmp_path: Path) -> None:
    first = Daemon(tmp_path, "1xA100-40GB").start()
    job = run_job(first, 6, 8192, memory="10Gi")
    try:
        holding(first, job)
        assert cli("suspend", str(job), url=first.url).returncode == 0
        assert until(lambda: elastic_state(first, job) == "suspended", 10)
        first.kill(signal.SIGKILL)
        second = Daemon(tmp_path, "1xA100-40GB").start()
        try:
            assert until(lambda: elastic_state(second, job) == "suspended", 10)
            assert gpu_used(second) == 0
            assert cli("resume", str(job), url=second.url).returncode == 0
            assert until(lambda: elastic_state(second, job) == "running", 10)
            assert second.wait(job)["state"] == "succeeded"
            assert "intact after" in output(second, job)
        finally:
            second.stop()
    finally:
        _kill_jobs(first)
