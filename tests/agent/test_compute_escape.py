"""Compute escapes: a process of a job whose compute the arbiter holds uses the GPU without
asking for a lease (it runs on the simulated driver without the interception library). The
watchdog finds it from the driver's per-process GPU time within 5 s, and kills it under
`--watchdog kill`; the job's process that asks for its leases is left alone. And a running job's
compute weight changed at the arbiter (a resize)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon
from tests.agent.watchdog_support import (
    job_stdout,
    pids_in,
    wait_for_job_event,
    wait_for_line,
    wait_gone,
)

from gpupool.agent.arbiters import NodeArbiter
from gpupool.core.errors import DeviceError
from gpupool.devices.procfs import process_start_time
from gpupool.devices.sim.state import STATE_FILE, SimState
from gpupool.isolation.arbiter import find_share
from gpupool.isolation.arbiter_control import node_arbiter_dir

pytestmark = pytest.mark.serial  # wall-clock shares and latencies: run alone (Makefile)

REPORT_WITHIN_S = 5.0
SHARED_MIB = 256  # the process under the library
ESCAPED_MIB = 320  # the one without it


def _escaping_job(daemon: Daemon, seconds: int = 60) -> int:
    python, job = shlex.quote(sys.executable), shlex.quote(CUDA_JOB)
    script = (
        f"{python} {job} {seconds} {SHARED_MIB} & "
        f"env -u LD_PRELOAD {python} {job} {seconds} {ESCAPED_MIB} & wait"
    )
    return daemon.submit(["sh", "-c", script], memory="4GiB", compute=30)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _escape_events(daemon: Daemon, job_id: int) -> list[dict[str, object]]:
    events = daemon.call("GET", "/v1/events", params={"limit": 1000})["events"]
    return [e for e in events if e.get("job_id") == job_id and e["kind"] == "compute_escape"]


def test_a_compute_escape_is_reported_within_5_s(reporting: Daemon) -> None:
    job_id = _escaping_job(reporting)
    escaped = wait_for_line(job_stdout(reporting, job_id), f"holding {ESCAPED_MIB} MiB")
    event = wait_for_job_event(reporting, job_id, "compute_escape")
    assert event["at"] - escaped <= REPORT_WITHIN_S, event
    assert "without asking the compute arbiter for a lease" in event["detail"]
    (pid,) = pids_in(event["detail"])
    # the escaper, not the process that asks for its leases
    assert _cmdline(pid)[-1] == str(ESCAPED_MIB)
    assert reporting.call("GET", f"/v1/jobs/{job_id}")["state"] == "running"
    time.sleep(2)
    assert len(_escape_events(reporting, job_id)) == 1  # recorded once while it goes on
    assert process_start_time(pid) is not None  # only reported


def test_a_compute_escape_is_killed_and_the_shared_process_goes_on(killing: Daemon) -> None:
    job_id = _escaping_job(killing)
    escaped = wait_for_line(job_stdout(killing, job_id), f"holding {ESCAPED_MIB} MiB")
    found = wait_for_job_event(killing, job_id, "compute_escape")
    assert found["at"] - escaped <= REPORT_WITHIN_S
    (pid,) = pids_in(found["detail"])
    kill = wait_for_job_event(killing, job_id, "watchdog_kill")
    assert kill["detail"] == f"pid {pid}: killed with SIGKILL"
    assert wait_gone(pid)
    # the job's other process asks for its leases: no finding, it runs on
    time.sleep(3)
    assert len(_escape_events(killing, job_id)) == 1
    assert killing.call("GET", f"/v1/jobs/{job_id}")["state"] == "running"


def test_a_running_jobs_compute_weight_changes_at_the_arbiter(reporting: Daemon) -> None:
    """The daemon's side of a resize: NodeArbiter.set_job_weight on a running job's share,
    seen in the arbiter's view (as `gpupool gpus` shows it)."""
    job_id = reporting.submit(
        [sys.executable, CUDA_JOB, "30", str(SHARED_MIB)], memory="4GiB", compute=30
    )
    wait_for_line(job_stdout(reporting, job_id), f"holding {SHARED_MIB} MiB")
    arbiter = NodeArbiter(node_arbiter_dir(reporting.node_dir), reporting.state_dir)
    share_id = arbiter.share_of(f"job {job_id}").share_id
    state = SimState.open(reporting.node_dir / STATE_FILE)
    uuid = state.gpu(0).uuid
    state.close()

    def percent() -> int | None:
        found = find_share(arbiter.directory, uuid, share_id)
        return found.percent if found is not None else None

    assert percent() == 30
    arbiter.set_job_weight(job_id, 60)
    assert percent() == 60
    with pytest.raises(DeviceError, match="no such share"):
        arbiter.set_job_weight(job_id + 1000, 50)
