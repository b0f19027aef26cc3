"""A service scaled to zero parks its last replica in host memory (elastic suspend) and the next
request resumes it: a real daemon on a simulated node, a real replica of the example model server,
real HTTP through the router; and the fallbacks when the parked replica cannot come back."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tests.agent.daemon_support import cli, until
from tests.agent.services_support import Routed, routed_on, start_routed

from gpupool.devices.sim.state import SimState

MiB = 1024 * 1024


routed = routed_on("1xA100-40GB")


def gpu_used(routed: Routed) -> int:
    state = SimState.open(routed.daemon.node_dir / "state.bin")
    try:
        return state.gpu(0).memory_used
    finally:
        state.close()


def elastic_state(routed: Routed, job: int) -> str:
    shown = routed.daemon.job(job).get("elastic")
    return "running" if shown is None else str(shown["state"])


def parked(routed: Routed, name: str) -> dict[str, Any]:
    """The service once its one replica is suspended (its job still running)."""
    routed.create(name, min_replicas=0, max_replicas=1, idle_s=1.0, window_s=0.5)
    job = routed.ready(name)["replica_list"][0]["job_id"]
    assert gpu_used(routed) == 256 * MiB  # the model server's weights

    def suspended() -> dict[str, Any] | None:
        service = routed.service(name)
        return service if service["replicas"]["suspended"] == 1 else None

    service = until(suspended, timeout=15)
    assert service, routed.service(name)
    assert until(lambda: elastic_state(routed, job) == "suspended", timeout=10)
    return service


def test_scale_to_zero_suspends_and_a_request_resumes_the_same_replica(routed: Routed) -> None:
    service = parked(routed, "sleepy")
    (replica,) = service["replica_list"]
    job = replica["job_id"]
    assert replica["state"] == "suspended"
    assert service["replicas"]["ready"] == 0 and service["replicas"]["desired"] == 0
    assert routed.daemon.job(job)["state"] == "running"  # parked, not cancelled
    assert gpu_used(routed) == 0  # its GPU memory is free for others
    listed = cli("service", "ls", url=routed.daemon.url)
    assert listed.returncode == 0 and "0 (1 suspended)" in listed.stdout, listed.stdout
    described = cli("service", "describe", "sleepy", url=routed.daemon.url).stdout
    assert "1 suspended in host memory" in described, described
    began = time.monotonic()
    answer = httpx.get(f"{routed.base}/sleepy/infer", timeout=60)
    woke = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    service = routed.service("sleepy")
    assert [r["job_id"] for r in service["replica_list"]] == [job]  # the same job, resumed
    assert service["replicas"]["ready"] == 1 and service["replicas"]["suspended"] == 0
    assert gpu_used(routed) == 256 * MiB
    assert woke < 20, woke
    kinds = [e["kind"] for e in routed.daemon.job(job)["events"]]
    assert kinds[-4:] == ["suspended", "resume", "resuming", "resumed"], kinds
    events = [e["detail"] for e in service["events"]]
    assert any("suspended to host memory" in e for e in events), events
    assert any("resumed: its memory is back" in e for e in events), events
    assert service["restarts"] == 0


def test_a_parked_replica_that_died_is_replaced_by_a_new_one(routed: Routed) -> None:
    service = parked(routed, "fragile")
    job = service["replica_list"][0]["job_id"]
    pids = routed.daemon.state_dir / "jobs" / str(job) / "pids.json"
    os.killpg(int(json.loads(pids.read_text())["job"]), signal.SIGKILL)
    assert until(lambda: routed.service("fragile")["replica_list"] == [], timeout=15)
    answer = httpx.get(f"{routed.base}/fragile/infer", timeout=60)
    assert answer.status_code == 200, answer.text
    service = routed.service("fragile")
    (replica,) = service["replica_list"]
    assert replica["job_id"] != job and replica["state"] == "ready"
    events = [e["detail"] for e in service["events"]]
    assert any("while suspended: the next request starts a new one" in e for e in events)
    assert service["restarts"] == 0 and service["problem"] == ""  # no failure of the service


def test_a_parked_replica_without_room_to_resume_gives_way_to_a_new_one(routed: Routed) -> None:
    service = parked(routed, "crowded")
    job = service["replica_list"][0]["job_id"]
    # a job takes the room the parked replica's share held; it ends in a few seconds
    hog = routed.daemon.submit([sys.executable, "-c", "import time; time.sleep(4)"], memory="39Gi")
    assert until(lambda: routed.daemon.job(hog)["state"] == "running", timeout=10)
    answer = httpx.get(f"{routed.base}/crowded/infer", timeout=60)
    assert answer.status_code == 200, answer.text  # held until a new replica could start
    service = routed.service("crowded")
    (replica,) = service["replica_list"]
    assert replica["job_id"] != job
    assert routed.daemon.job(job)["state"] == "cancelled"
    events = [e["detail"] for e in service["events"]]
    assert any("could not resume (waiting to resume: GPU 0" in e for e in events), events


def test_a_parked_replica_of_a_deleted_service_is_cancelled(routed: Routed) -> None:
    service = parked(routed, "gone")
    job = service["replica_list"][0]["job_id"]
    routed.daemon.call("DELETE", "/v1/services/gone", json={})
    assert until(lambda: routed.daemon.job(job)["state"] == "cancelled", timeout=15)


def test_a_daemon_killed_while_a_replica_is_parked_adopts_it_parked(
    routed: Routed, tmp_path: Path
) -> None:
    job = parked(routed, "kept")["replica_list"][0]["job_id"]
    routed.daemon.kill()
    again = start_routed(tmp_path, "1xA100-40GB")  # the same state dir, a new router port
    try:
        time.sleep(1.0)  # a few passes of the new daemon's loop: it stays parked
        service = again.service("kept")
        assert service["replicas"]["suspended"] == 1, service
        assert [r["job_id"] for r in service["replica_list"]] == [job]
        assert gpu_used(again) == 0
        answer = httpx.get(f"{again.base}/kept/infer", timeout=60)
        assert answer.status_code == 200, answer.text
        assert [r["job_id"] for r in again.service("kept")["replica_list"]] == [job]
    finally:
        again.daemon.stop()


def test_a_parked_replica_of_an_updated_service_is_cancelled(routed: Routed) -> None:
    job = parked(routed, "moved")["replica_list"][0]["job_id"]
    routed.daemon.call("POST", "/v1/services/moved/update", json={"env": {"VERSION": "2"}})
    assert until(lambda: routed.daemon.job(job)["state"] == "cancelled", timeout=15)
    answer = httpx.get(f"{routed.base}/moved/infer", timeout=60)  # a new replica, generation 2
    assert answer.status_code == 200, answer.text
    (replica,) = routed.service("moved")["replica_list"]
    assert replica["job_id"] != job and replica["generation"] == 2
