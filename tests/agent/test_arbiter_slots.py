"""A job's share at the node's compute arbiter is given back however the job ends: the arbiter
has 64 slots a GPU, and a daemon that kept the share of every ended job ran the 65th job
unarbitrated (its cap not held), and killed it as a compute escape under `--watchdog kill`."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, until
from tests.agent.watchdog_support import job_stdout, wait_for_line

from gpupool.isolation.arbiter import SHARES, read_shares, view_file
from gpupool.isolation.arbiter_control import node_arbiter_dir

pytestmark = pytest.mark.serial  # the watchdog's findings are timed: run alone (Makefile)

ENDED = ("succeeded", "failed", "cancelled")
WORKING_MIB = 256


def _gpu_shares(daemon: Daemon) -> list[int]:
    """The share ids registered on each GPU of the daemon's simulated node, all GPUs together."""
    directory = node_arbiter_dir(daemon.node_dir)
    return [
        share.share_id
        for view in directory.glob("gpu-*")
        for share in read_shares(view_file(directory, "GPU-" + view.name.removeprefix("gpu-")))
    ]


def _events(daemon: Daemon, job_id: int) -> list[str]:
    events = daemon.call("GET", "/v1/events", params={"limit": 1000})["events"]
    return [e["kind"] for e in events if e.get("job_id") == job_id]


def test_more_jobs_than_slots_end_and_the_next_one_is_arbitrated(killing: Daemon) -> None:
    ids = [killing.submit(["true"], memory="1GiB", compute=5) for _ in range(SHARES + 6)]
    for job_id in ids:
        assert killing.wait(job_id, timeout=180)["state"] == "succeeded"
    working = killing.submit(
        [sys.executable, CUDA_JOB, "8", str(WORKING_MIB)], memory="4GiB", compute=30
    )
    wait_for_line(job_stdout(killing, working), f"holding {WORKING_MIB} MiB")
    time.sleep(4)  # the watchdog tells an escape within 2.5 s
    assert killing.job(working)["state"] == "running", killing.job(working)
    assert "compute_escape" not in _events(killing, working)
    assert len(_gpu_shares(killing)) == 1  # its own
    assert killing.wait(working, timeout=60)["state"] == "succeeded"
    assert until(lambda: not _gpu_shares(killing)), _gpu_shares(killing)


def _pids(daemon: Daemon, job_id: int) -> dict[str, int] | None:
    path = daemon.state_dir / "jobs" / str(job_id) / "pids.json"
    return json.loads(path.read_text()) if path.exists() else None


def _running(daemon: Daemon, seconds: int = 60) -> int:
    job_id = daemon.submit(["sleep", str(seconds)], memory="1GiB", compute=10)
    assert until(lambda: _pids(daemon, job_id))
    return job_id


def test_a_cancelled_job_and_one_whose_supervisor_was_killed_give_their_share_back(
    reporting: Daemon,
) -> None:
    cancelled, orphaned = _running(reporting), _running(reporting)
    assert len(until(lambda: len(_gpu_shares(reporting)) == 2 and _gpu_shares(reporting))) == 2
    reporting.call("POST", f"/v1/jobs/{cancelled}/cancel", json={})
    pids = _pids(reporting, orphaned)
    assert pids is not None
    os.kill(pids["supervisor"], signal.SIGKILL)
    os.killpg(pids["job"], signal.SIGKILL)
    for job_id in (cancelled, orphaned):
        assert reporting.wait(job_id, ENDED, timeout=30)["state"] in ("cancelled", "failed")
    assert until(lambda: not _gpu_shares(reporting)), _gpu_shares(reporting)


def test_a_job_that_ended_while_the_daemon_was_down_gives_its_share_back(
    reporting: Daemon,
) -> None:
    job_id = _running(reporting, seconds=3)
    reporting.kill()
    time.sleep(4)  # it ends meanwhile; the new daemon registers it again, then records its end
    reporting.start()
    assert reporting.wait(job_id, timeout=30)["state"] == "succeeded"
    assert until(lambda: not _gpu_shares(reporting)), _gpu_shares(reporting)
