"""Services scale with their traffic: a real daemon on a simulated node, real replicas of the
example model server, real HTTP through the router."""

from __future__ import annotations

import time

import httpx
from tests.agent.daemon_support import scrape, until
from tests.agent.services_support import Load, Routed, routed_on

routed = routed_on()


def test_scale_out_under_load_then_in_with_every_request_answered(routed: Routed) -> None:
    routed.create("chat", min_replicas=1, max_replicas=3, concurrency=2, window_s=2.0)
    routed.ready("chat")
    load = Load(f"{routed.base}/chat/infer?delay=0.3", workers=6)
    with load.running():
        # 6 requests in flight against a concurrency of 2: three replicas, within seconds
        scaled = routed.ready("chat", 3, timeout=20)
        assert scaled["replicas"]["desired"] == 3
        time.sleep(1.5)
    assert len(load.ports) == 3, load.ports  # every replica served
    # the load is gone: after the 2 s window, back to MIN, the extra replicas drained first
    back = until(lambda: routed.service("chat")["replicas"]["ready"] == 1, timeout=20)
    assert back, routed.service("chat")
    described = routed.service("chat")
    assert set(load.statuses) == {200}, load.statuses
    assert described["statuses"] == {"200": sum(load.statuses.values())}
    assert any("scaled in to 1" in e["detail"] for e in described["events"]), described["events"]
    samples = scrape(routed.daemon)  # per-service metrics, as Prometheus reads them
    total = sum(load.statuses.values())
    assert samples["gpupool_service_requests_total"] == [
        ({"service": "chat", "code": "200"}, total)
    ]
    assert samples["gpupool_service_request_duration_seconds_count"] == [
        ({"service": "chat"}, total)
    ]
    replicas = {labels["state"]: v for labels, v in samples["gpupool_service_replicas"]}
    assert replicas["ready"] == 1 and replicas["desired"] == 1
    assert samples["gpupool_service_queue_length"] == [({"service": "chat"}, 0)]
    gpus = described["gpus"]
    assert gpus, described  # its replicas are placed jobs, shown with their GPUs
    jobs = routed.daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]
    replicas = [job for job in jobs if job["name"].startswith("chat/")]
    assert len(replicas) == 3 and all(job["compute"] == 20 for job in replicas)


def test_scale_to_zero_then_the_next_request_wakes_a_replica(routed: Routed) -> None:
    # mode mps: its replica cannot be suspended, so it is cancelled (a shim one is parked in
    # host memory: test_services_parking.py)
    # MIN 1 until its replica is ready: the idle clock must not run out while a loaded machine
    # starts it
    routed.create("sleepy", min_replicas=1, max_replicas=1, idle_s=1.0, window_s=0.5, mode="mps")
    first = routed.ready("sleepy")
    job = first["replica_list"][0]["job_id"]
    scaled = {"min_replicas": 0, "max_replicas": 1}
    routed.daemon.call("POST", "/v1/services/sleepy/scale", json=scaled)
    gone = until(lambda: routed.service("sleepy")["replicas"]["desired"] == 0, timeout=15)
    assert gone, routed.service("sleepy")
    assert until(lambda: routed.daemon.job(job)["state"] == "cancelled", timeout=15)
    # the service manager forgets the replica at its next pass after the job ended
    assert until(lambda: routed.service("sleepy")["replica_list"] == [], timeout=15)
    began = time.monotonic()
    answer = httpx.get(f"{routed.base}/sleepy/infer", timeout=60)
    woke = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    service = routed.service("sleepy")
    assert service["replicas"]["ready"] == 1 and service["replica_list"][0]["job_id"] != job
    assert woke < 20, woke  # held by the router while a replica started, not refused
    assert any("no request for 1s" in e["detail"] for e in service["events"])


def test_rolling_update_replaces_replicas_without_losing_a_request(routed: Routed) -> None:
    routed.create("api", min_replicas=2, max_replicas=2, concurrency=4)
    before = routed.ready("api", 2)
    old_jobs = {r["job_id"] for r in before["replica_list"]}
    load = Load(f"{routed.base}/api/infer?delay=0.2", workers=4)
    with load.running():
        updated = routed.daemon.call(
            "POST", "/v1/services/api/update", json={"env": {"VERSION": "2"}}
        )["service"]
        assert updated["generation"] == 2

        def rolled() -> bool:
            service = routed.service("api")
            replicas = service["replica_list"]
            return len(replicas) == 2 and all(
                r["generation"] == 2 and r["state"] == "ready" for r in replicas
            )

        assert until(rolled, timeout=40), routed.service("api")
        time.sleep(0.5)
    assert set(load.statuses) == {200}, load.statuses
    for job in old_jobs:  # drained, then cancelled
        assert until(lambda job=job: routed.daemon.job(job)["state"] == "cancelled", timeout=15)
    events = [e["detail"] for e in routed.service("api")["events"]]
    assert sum("replaced by a newer generation" in e for e in events) == 2, events


def test_scale_in_drains_the_requests_in_flight_before_a_replica_stops(routed: Routed) -> None:
    routed.create("batch", min_replicas=3, max_replicas=3, concurrency=2)
    routed.ready("batch", 3)
    load = Load(f"{routed.base}/batch/infer?delay=1.0", workers=6)
    seen_draining: list[dict[str, object]] = []
    with load.running():
        assert until(lambda: routed.service("batch")["in_flight"] >= 5, timeout=10)
        routed.daemon.call(
            "POST", "/v1/services/batch/scale", json={"min_replicas": 1, "max_replicas": 1}
        )

        def draining_busy() -> bool:
            replicas = routed.service("batch")["replica_list"]
            busy = [r for r in replicas if r["state"] == "draining" and r["in_flight"]]
            seen_draining.extend(busy)
            return bool(busy)

        assert until(draining_busy, timeout=5)  # stopping, yet still answering what it has
        assert until(lambda: len(routed.service("batch")["replica_list"]) == 1, timeout=20)
    assert set(load.statuses) == {200}, load.statuses
    assert seen_draining
