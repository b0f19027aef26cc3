"""No request lost with the servers people run: the router in front of replicas on servers no one
here wrote (http.server speaking HTTP/1.0, uvicorn, aiohttp, gunicorn's sync workers), under
queueing, scale-out, a rolling update, scale-in and a replica killed with -9. Every answer is a
200 but the 502s of the killed replica's requests, which it had taken, and those are counted.
A real daemon on a simulated node, its router, real replica processes, real HTTP."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from tests.agent.daemon_support import until
from tests.agent.services_support import Load, Routed, routed_on

routed = routed_on()
REPLICA = str(Path(__file__).with_name("matrix_replica.py"))
SERVERS = ["stdlib", "uvicorn", "aiohttp", "gunicorn"]
#: how httpx tells a connection cut inside an answer
CUT = {"RemoteProtocolError", "ReadError"}
#: requests each replica takes at once: the load below is twice what one replica takes
CONCURRENCY = 2


def matrix(routed: Routed, name: str, server: str, **body: object) -> None:
    argv = [sys.executable, REPLICA, server]
    routed.create(name, argv=argv, health="/health", concurrency=CONCURRENCY, **body)


def scale(routed: Routed, name: str, count: int) -> None:
    bounds = {"min_replicas": count, "max_replicas": count}
    routed.daemon.call("POST", f"/v1/services/{name}/scale", json=bounds)


def rolled(routed: Routed, name: str, generation: int, count: int) -> bool:
    replicas = routed.service(name)["replica_list"]
    return len(replicas) == count and all(
        r["generation"] == generation and r["state"] == "ready" for r in replicas
    )


def only_ok(load: Load) -> None:
    assert set(load.statuses) == {200}, load.statuses


@pytest.mark.parametrize("server", SERVERS)
def test_no_request_is_lost_through_scaling_and_a_rolling_update(
    routed: Routed, server: str
) -> None:
    matrix(routed, "m", server, min_replicas=1, max_replicas=1, window_s=1.0)
    routed.ready("m")
    load = Load(f"{routed.base}/m/infer?delay=0.02", workers=4)
    with load.running():
        time.sleep(1.0)  # queueing: four clients, one replica taking two at a time
        scale(routed, "m", 3)  # scale-out
        routed.ready("m", 3)
        time.sleep(1.0)
        update = {"env": {"VERSION": "2"}}
        routed.daemon.call("POST", "/v1/services/m/update", json=update)
        assert until(lambda: rolled(routed, "m", 2, 3), timeout=60), routed.service("m")
        time.sleep(0.5)
        scale(routed, "m", 1)  # scale-in
        assert until(lambda: len(routed.service("m")["replica_list"]) == 1, timeout=30)
        time.sleep(1.0)
    only_ok(load)
    assert len(load.ports) >= 4, load.ports  # the first, two added, three updated: all served
    total = sum(load.statuses.values())
    counted = until(lambda: routed.service("m")["statuses"] == {"200": total}, timeout=10)
    assert counted, routed.service("m")["statuses"]


@pytest.mark.parametrize("server", SERVERS)
def test_a_killed_replica_fails_only_what_it_had_taken_and_says_so(
    routed: Routed, server: str
) -> None:
    matrix(routed, "k", server, min_replicas=2, max_replicas=2)
    routed.ready("k", 2)
    load = Load(f"{routed.base}/k/infer?delay=0.05", workers=4)
    with load.running():
        assert until(lambda: len(load.ports) == 2, timeout=10), load.ports
        pid = httpx.get(f"{routed.base}/k/infer", timeout=30).json()["pid"]
        os.kill(pid, signal.SIGKILL)
        assert until(lambda: routed.service("k")["restarts"] >= 1, timeout=30)
        routed.ready("k", 2)
        time.sleep(1.0)
    # a 502, or a cut connection where the replica's answer had begun: both counted as 502
    failed = sum(n for status, n in load.statuses.items() if status != 200)
    assert set(load.statuses) <= {200, 502, *CUT}, load.statuses
    assert failed <= CONCURRENCY, load.statuses  # only what the killed replica had taken
    total = sum(load.statuses.values()) + 1
    expected = {"200": total - failed} | ({"502": failed} if failed else {})
    counted = until(lambda: routed.service("k")["statuses"] == expected, timeout=10)
    assert counted, (routed.service("k")["statuses"], expected)


@pytest.mark.parametrize("server", ["uvicorn", "aiohttp"])
def test_a_kept_alive_connection_the_replica_closes_as_idle_loses_no_request(
    routed: Routed, server: str
) -> None:
    # a keep-alive timeout of 50 ms and clients pausing about as long between requests: the
    # replica closes a pooled connection just as the router sends a request on it, many times
    argv = [sys.executable, REPLICA, server, "0.05"]
    routed.create("idle", argv=argv, health="/health", min_replicas=1, max_replicas=1)
    routed.ready("idle")
    load = Load(f"{routed.base}/idle/infer", workers=4, pause=0.05)
    with load.running():
        time.sleep(5.0)
    only_ok(load)  # each one the replica had not read went again, never a 502
    total = sum(load.statuses.values())
    counted = until(lambda: routed.service("idle")["statuses"] == {"200": total}, timeout=10)
    assert counted, routed.service("idle")["statuses"]


def test_a_request_a_killed_replica_never_took_goes_to_its_replacement(routed: Routed) -> None:
    # http.server's HTTPServer takes one request at a time: the router's second request waits
    # in its listen queue, unread, when the replica is killed in the middle of the first
    argv = [sys.executable, REPLICA, "stdlib-single"]
    routed.create("one", argv=argv, health="/health", concurrency=2)
    routed.ready("one")
    pid = httpx.get(f"{routed.base}/one/infer", timeout=30).json()["pid"]
    answers: dict[str, int] = {}

    def ask(name: str, delay: float) -> None:
        url = f"{routed.base}/one/infer?delay={delay}"
        answers[name] = httpx.get(url, timeout=60).status_code

    taken = threading.Thread(target=ask, args=("taken", 3.0))
    taken.start()
    assert until(lambda: routed.service("one")["in_flight"] == 1, timeout=10)
    queued = threading.Thread(target=ask, args=("queued", 0.0))
    queued.start()
    assert until(lambda: routed.service("one")["in_flight"] == 2, timeout=10)
    time.sleep(0.3)  # the second request is in the replica's listen queue
    os.kill(pid, signal.SIGKILL)
    taken.join(60)
    queued.join(60)
    # the first was taken and failed (502, counted); the second never reached the replica: it
    # waited for the replacement and was answered
    assert answers == {"taken": 502, "queued": 200}
    counted = until(lambda: routed.service("one")["statuses"] == {"200": 2, "502": 1})
    assert counted, routed.service("one")["statuses"]
