"""Queue order, backfill, cancel and drain on a real daemon (a one-GPU simulated node)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import Daemon, cli

from gpupool.core.errors import InvalidRequest


@pytest.fixture
def one_gpu(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "1xA100-40GB")


def _state(daemon: Daemon, job_id: int) -> str:
    return str(daemon.job(job_id)["state"])


def test_high_priority_goes_first_then_first_come_first_served(one_gpu: Daemon) -> None:
    one_gpu.call("POST", "/v1/drain", json={"on": True})
    low = one_gpu.submit(["true"], compute=100, priority="low")
    first = one_gpu.submit(["true"], compute=100)
    second = one_gpu.submit(["true"], compute=100)
    one_gpu.call("POST", "/v1/drain", json={"on": False})
    started = {j: one_gpu.wait(j)["started_at"] for j in (low, first, second)}
    assert started[first] < started[second] < started[low]


def test_backfill_never_takes_room_the_head_waits_for(one_gpu: Daemon) -> None:
    running = one_gpu.submit(["sleep", "2"], compute=50, memory="8GiB")
    one_gpu.wait(running, ("running",))
    one_gpu.call("POST", "/v1/drain", json={"on": True})
    head = one_gpu.submit(["true"], compute=60, memory="8GiB")  # blocked by `running`
    small = one_gpu.submit(["sleep", "5"], compute=20, memory="4GiB")  # fits beside the head
    greedy = one_gpu.submit(["true"], compute=25, memory="4GiB")  # fits now, delays the head
    one_gpu.call("POST", "/v1/drain", json={"on": False})
    one_gpu.wait(small, ("running",))
    time.sleep(0.5)
    assert _state(one_gpu, head) == "queued" and _state(one_gpu, greedy) == "queued"
    assert one_gpu.job(greedy)["waiting"] == [
        f"it fits now, but would delay job {head} queued ahead of it"
    ]
    placed = [e["detail"] for e in one_gpu.job(small)["events"] if e["kind"] == "placed"]
    assert placed == ["GPUs 0 (backfill)"]
    head_job = one_gpu.wait(head)
    assert head_job["started_at"] >= one_gpu.job(running)["finished_at"]
    # the pass that records the head's end starts the greedy job: wait for it, not just the end
    assert one_gpu.wait(greedy)["started_at"] >= head_job["started_at"]


def test_cancel_terms_then_kills_and_a_queued_job_never_starts(one_gpu: Daemon) -> None:
    polite = one_gpu.submit(["sleep", "60"], compute=40)
    stubborn = one_gpu.submit(["sh", "-c", "trap '' TERM; sleep 60"], compute=40)
    queued = one_gpu.submit(["true"], compute=50)
    for job in (polite, stubborn):
        one_gpu.wait(job, ("running",))
        assert one_gpu.job(job)["started_at"] is not None
    time.sleep(0.3)  # the shell sets its trap
    done = cli("cancel", str(queued), str(polite), str(stubborn), url=one_gpu.url)
    assert done.returncode == 0, done.stderr
    assert one_gpu.job(queued)["state"] == "cancelled"
    assert one_gpu.wait(polite)["exit_code"] == 143  # SIGTERM, as a shell reports it
    killed = one_gpu.wait(stubborn)
    assert killed["state"] == "cancelled" and killed["exit_code"] == 137  # SIGKILL after 1 s
    assert one_gpu.job(queued)["started_at"] is None
    with pytest.raises(InvalidRequest, match="already finished"):
        one_gpu.call("POST", f"/v1/jobs/{queued}/cancel", json={})


def test_drain_starts_nothing_new_and_lets_running_jobs_finish(one_gpu: Daemon) -> None:
    running = one_gpu.submit(["sleep", "1"], compute=50)
    one_gpu.wait(running, ("running",))
    assert cli("drain", url=one_gpu.url, check=True).stdout.startswith("draining")
    later = one_gpu.submit(["true"], compute=10)
    assert one_gpu.wait(running)["state"] == "succeeded"
    time.sleep(0.5)
    job = one_gpu.job(later)
    assert job["state"] == "queued" and "draining" in job["waiting"][0]
    cli("drain", "--off", url=one_gpu.url, check=True)
    assert one_gpu.wait(later)["state"] == "succeeded"


def test_a_low_job_is_admitted_beside_guaranteed_compute_and_holds_none(one_gpu: Daemon) -> None:
    first = one_gpu.submit(["sleep", "30"], compute=50, memory="4GiB")
    low = one_gpu.submit(["sleep", "30"], compute=100, memory="4GiB", priority="low")
    second = one_gpu.submit(["sleep", "30"], compute=50, memory="4GiB")
    for job_id in (first, low, second):
        one_gpu.wait(job_id, ("running",), timeout=10)
    late = one_gpu.submit(["true"], compute=10, memory="1GiB")
    time.sleep(0.5)  # a pass of the queue
    assert one_gpu.job(late)["waiting"] == [
        "GPU 0: compute 10% needed, 0% free",
        "1 GPU needed, 0 can take the share now",
    ]
    (gpu,) = one_gpu.call("GET", "/v1/node")["gpus"]
    assert gpu["compute_admitted"] == 1000
    for job_id in (late, first, low, second):
        one_gpu.call("POST", f"/v1/jobs/{job_id}/cancel", json={})
