"""More models than fit on a GPU: services whose shares together exceed it swap, the idle one
parked in host memory (least recently used first) for the one a request wants, while the router
holds that request. A real daemon and router on a simulated 40 GB GPU, real replicas of the
example model server, each with a 24 GiB share (one fits at a time)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import EXAMPLES, Daemon, cli, scrape, until
from tests.agent.multiuser_support import group_daemon
from tests.agent.services_support import (
    MODEL_SERVER,
    Load,
    Routed,
    free_port,
    routed_on,
    start_routed,
)
from tests.users import gpupool_as

from gpupool.core.errors import InvalidRequest, Unschedulable

routed = routed_on("1xA100-40GB")

OPENAI_SERVER = str(EXAMPLES / "openai_server.py")
#: a share two of which do not fit the 40 GB GPU
SHARE = {"memory": "24Gi", "min_replicas": 0, "max_replicas": 1, "window_s": 0.5}


def replica(routed: Routed, name: str) -> dict[str, Any]:
    (found,) = routed.service(name)["replica_list"]
    return found


def state_of(routed: Routed, name: str) -> str:
    found = routed.service(name)["replica_list"]
    return str(found[0]["state"]) if found else "none"


def test_a_service_without_room_swaps_out_an_idle_one_and_back(routed: Routed) -> None:
    routed.create("first", **SHARE)
    job_first = routed.ready("first")["replica_list"][0]["job_id"]
    routed.create("second", **SHARE)
    # the second's replica waits in the queue: the first, idle, is parked for it
    service = routed.ready("second", timeout=60)
    job_second = service["replica_list"][0]["job_id"]
    first = routed.service("first")
    assert first["replica_list"][0]["state"] == "suspended", first
    assert first["replica_list"][0]["job_id"] == job_first  # parked, not stopped
    assert first["resident"] is False and first["swaps"]["out"] == 1, first
    events = [e["detail"] for e in first["events"]]
    assert any("swapped out for service second" in e for e in events), events
    # a request for the parked one: the second (idle, least recently used) goes, it comes back
    answer = httpx.get(f"{routed.base}/first/infer", timeout=90)
    assert answer.status_code == 200, answer.text
    first = routed.service("first")
    assert [r["job_id"] for r in first["replica_list"]] == [job_first]  # the same job
    assert first["resident"] is True
    assert first["swaps"]["in"] == 1 and first["swaps"]["last_in_s"] > 0, first
    assert until(lambda: state_of(routed, "second") == "suspended", timeout=30)
    second = routed.service("second")
    assert second["replica_list"][0]["job_id"] == job_second
    assert second["swaps"]["out"] == 1 and second["resident"] is False
    # and back again: a request for the second swaps the first out
    answer = httpx.get(f"{routed.base}/second/infer", timeout=90)
    assert answer.status_code == 200, answer.text
    assert routed.service("second")["swaps"]["in"] == 1
    assert until(lambda: state_of(routed, "first") == "suspended", timeout=30)
    assert routed.service("first")["swaps"]["out"] == 2
    # what was swapped, where an operator looks: service ls, /metrics
    listed = cli("service", "ls", url=routed.daemon.url).stdout
    (line,) = [line for line in listed.splitlines() if line.startswith("first ")]
    assert "0 (1 suspended)" in line and "2 out, 1 in, last " in line, listed
    samples = scrape(routed.daemon)
    swaps = {
        (labels["service"], labels["direction"]): value
        for labels, value in samples["gpupool_service_swaps_total"]
    }
    assert swaps == {
        ("first", "out"): 2,
        ("first", "in"): 1,
        ("second", "out"): 1,
        ("second", "in"): 1,
    }, swaps
    took = dict(
        (labels["service"], value)
        for labels, value in samples["gpupool_service_swap_in_seconds_count"]
    )
    assert took == {"first": 1, "second": 1}, took


def test_keep_alive_minus_one_is_never_swapped_out(routed: Routed) -> None:
    routed.create("pinned", **SHARE, keep_alive_s=-1)
    job = routed.ready("pinned")["replica_list"][0]["job_id"]
    routed.create("latecomer", **SHARE)
    assert until(lambda: "GPU 0" in replica(routed, "latecomer")["note"], timeout=15)
    time.sleep(2.0)  # a few passes of the service loop: nothing is swapped out for it
    pinned = routed.service("pinned")
    assert [(r["job_id"], r["state"]) for r in pinned["replica_list"]] == [(job, "ready")]
    assert pinned["swaps"]["out"] == 0 and pinned["resident"] is True
    assert replica(routed, "latecomer")["state"] == "queued"


def test_keep_alive_zero_parks_right_after_the_last_request(routed: Routed) -> None:
    # no stable window to wait (the default 30 s), no idle time (the default 5 min)
    body = {**SHARE, "window_s": 30.0, "keep_alive_s": 0}
    routed.create("brief", **body)
    answer = httpx.get(f"{routed.base}/brief/infer", timeout=60)  # starts it on demand
    assert answer.status_code == 200, answer.text
    assert until(lambda: state_of(routed, "brief") == "suspended", timeout=15)
    service = routed.service("brief")
    assert service["spec"]["keep_alive_s"] == 0 and service["resident"] is False


@pytest.mark.parametrize("value", [-2, -0.5, 31 * 86400])
def test_keep_alive_nonsense_is_refused_in_one_line(routed: Routed, value: float) -> None:
    body = {"name": "odd", "argv": ["true"], "keep_alive_s": value}
    with pytest.raises(InvalidRequest, match="invalid --keep-alive: 0s to 30d, or -1"):
        routed.daemon.call("POST", "/v1/services", json=body)
    assert routed.daemon.call("GET", "/v1/services")["services"] == []


def test_keep_alive_on_the_command_line(routed: Routed) -> None:
    bad = cli(
        "service", "create", "odd", "--keep-alive", "soon", "--", "true", url=routed.daemon.url
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--keep-alive" in bad.stderr, bad.stderr
    made = cli(
        "service",
        "create",
        "kept",
        "--keep-alive",
        "-1",
        "--replicas",
        "0..1",
        "--memory",
        "1Gi",
        "--",
        "true",
        url=routed.daemon.url,
    )
    assert made.returncode == 0, made.stderr
    assert routed.service("kept")["spec"]["keep_alive_s"] == -1


def test_a_model_larger_than_the_gpu_is_refused_at_create(routed: Routed) -> None:
    body = {"name": "huge", "argv": ["true"], "memory": "48Gi", "min_replicas": 0}
    with pytest.raises(Unschedulable) as refused:
        routed.daemon.call("POST", "/v1/services", json=body)
    assert refused.value.http_status == 409 and "\n" not in str(refused.value), refused.value
    assert routed.daemon.call("GET", "/v1/services")["services"] == []


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[Routed]:
    """A daemon whose parked replicas may hold 300 MiB of host memory: one model server's."""
    port = free_port()
    extra = ("--router", f"127.0.0.1:{port}", "--parked-memory", "300Mi")
    daemon = Daemon(tmp_path, "1xA100-40GB", extra).start()
    yield Routed(daemon, port)
    daemon.stop()
    _kill_jobs(daemon)


def test_parked_memory_past_its_bound_evicts_the_least_recent_to_a_cold_start(
    bounded: Routed,
) -> None:
    idle = {"memory": "2Gi", "min_replicas": 0, "max_replicas": 1, "idle_s": 1.0, "window_s": 0.5}
    bounded.create("older", **idle)
    job_older = bounded.ready("older")["replica_list"][0]["job_id"]
    assert until(lambda: state_of(bounded, "older") == "suspended", timeout=15)
    bounded.create("newer", **idle)
    bounded.ready("newer")
    answer = httpx.get(f"{bounded.base}/newer/infer", timeout=60)  # the more recently used
    assert answer.status_code == 200, answer.text
    # the newer parks too: two would hold 512 MiB, so the older is stopped
    assert until(lambda: state_of(bounded, "newer") == "suspended", timeout=15)
    assert until(lambda: bounded.daemon.job(job_older)["state"] == "cancelled", timeout=15)
    assert bounded.service("older")["replica_list"] == []
    events = [e["detail"] for e in bounded.service("older")["events"]]
    assert any("evicted to a cold start" in e and "--parked-memory" in e for e in events)
    assert bounded.service("older")["restarts"] == 0  # no failure of the service
    answer = httpx.get(f"{bounded.base}/older/infer", timeout=60)  # a new replica, cold
    assert answer.status_code == 200, answer.text
    (replica,) = bounded.service("older")["replica_list"]
    assert replica["job_id"] != job_older


def test_parked_memory_nonsense_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--state-dir",
            str(tmp_path / "state"),
            "--simulate",
            "1xA100-40GB",
            "--parked-memory",
            "lots",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--parked-memory" in done.stderr, done.stderr


def test_a_daemon_killed_while_a_model_is_swapped_out_finds_it_again(
    routed: Routed, tmp_path: Path
) -> None:
    routed.create("first", **SHARE, keep_alive_s=600)
    job_first = routed.ready("first")["replica_list"][0]["job_id"]
    routed.create("second", **SHARE)
    job_second = routed.ready("second", timeout=60)["replica_list"][0]["job_id"]
    assert state_of(routed, "first") == "suspended"
    routed.daemon.kill()  # SIGKILL: nothing written on the way out
    again = start_routed(tmp_path, "1xA100-40GB")  # the same state dir, a new router port
    try:
        time.sleep(1.0)  # a few passes of the new daemon's loop: it stays parked
        first = again.service("first")
        assert [(r["job_id"], r["state"]) for r in first["replica_list"]] == [
            (job_first, "suspended")
        ], first
        assert first["spec"]["keep_alive_s"] == 600  # stored with the service
        answer = httpx.get(f"{again.base}/first/infer", timeout=90)  # swapped in, not cold
        assert answer.status_code == 200, answer.text
        assert [r["job_id"] for r in again.service("first")["replica_list"]] == [job_first]
        assert until(lambda: state_of(again, "second") == "suspended", timeout=30)
        assert again.service("second")["replica_list"][0]["job_id"] == job_second
    finally:
        again.daemon.stop()
        _kill_jobs(again.daemon)


@pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")
def test_two_users_services_swap_on_one_gpu_each_running_as_its_owner() -> None:
    port = free_port()
    with group_daemon("1xA100-40GB", extra=("--router", f"127.0.0.1:{port}")) as (daemon, users):
        alice, bob = users
        routed = Routed(daemon, port)
        for user, name in ((alice, "alice-chat"), (bob, "bob-embed")):
            done = gpupool_as(
                user, "service", "create", name, "--memory", "24Gi", "--replicas", "0..1",
                "--keep-alive", "10m", "--workdir", "/tmp", "--",
                sys.executable, MODEL_SERVER, "--memory-mib", "128",
                url=daemon.url,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        routed.ready("bob-embed", timeout=60)  # alice's, idle, was swapped out for it
        assert until(lambda: state_of(routed, "alice-chat") == "suspended", timeout=30)
        answer = httpx.get(f"{routed.base}/alice-chat/infer", timeout=90)
        assert answer.status_code == 200, answer.text
        assert until(lambda: state_of(routed, "bob-embed") == "suspended", timeout=30)
        for name, user in (("alice-chat", alice), ("bob-embed", bob)):
            service = routed.service(name)
            assert service["swaps"]["out"] == 1, service
            job = service["replica_list"][0]["job_id"]
            assert daemon.job(job)["user"] == user.name  # each replica runs as its owner
        assert routed.service("alice-chat")["swaps"]["in"] == 1


def test_under_traffic_the_busy_service_stays_and_the_idle_ones_swap(routed: Routed) -> None:
    third = {**SHARE, "memory": "16Gi"}  # two of three fit the 40 GB GPU
    routed.create("busy", **third)
    busy = routed.ready("busy")["replica_list"][0]["job_id"]
    with Load(f"{routed.base}/busy/infer", workers=2, pause=0.02).running() as load:
        assert until(lambda: load.statuses[200] >= 10, timeout=30)  # busy from now on
        for name in ("left", "right"):
            routed.create(name, **third)
        answers = [
            httpx.get(f"{routed.base}/{name}/infer", timeout=90).status_code
            for name in ("left", "right") * 3
        ]
    assert answers == [200] * 6, answers
    assert set(load.statuses) == {200}, load.statuses
    service = routed.service("busy")
    assert [r["job_id"] for r in service["replica_list"]] == [busy]
    assert service["swaps"]["out"] == 0, service  # never idle: never swapped out
    for name in ("left", "right"):
        swaps = routed.service(name)["swaps"]
        assert swaps["out"] >= 2 and swaps["in"] >= 2, (name, swaps)


def test_a_swapped_out_openai_model_streams_a_chat_token_by_token(routed: Routed) -> None:
    # the example OpenAI server holding its weights on the simulated GPU: a real share
    for name in ("chat-a", "chat-b"):
        argv = [sys.executable, OPENAI_SERVER, name, "0.05", "--memory-mib", "256"]
        routed.create(name, argv=argv, **SHARE)
    routed.ready("chat-b", timeout=60)
    assert until(lambda: state_of(routed, "chat-a") == "suspended", timeout=30)
    api = openai.OpenAI(base_url=f"{routed.base}/v1", api_key="none", max_retries=0)
    began = time.monotonic()
    stream = api.chat.completions.create(
        model="chat-a", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    arrived = [(time.monotonic() - began, c.choices[0].delta.content) for c in stream]
    assert [word for _, word in arrived] == ["hello", "from", "chat-a"] * 2 + ["hello", "from"]
    # sent as they were made, 0.05 s apart (a read may take two at once on a busy machine)
    assert arrived[-1][0] - arrived[0][0] >= 0.25, arrived
    service = routed.service("chat-a")
    assert service["swaps"]["in"] == 1 and service["resident"] is True, service
    assert arrived[0][0] >= service["swaps"]["last_in_s"]  # the first token waited for the swap


def test_a_gpu_that_swaps_keeps_room_for_the_next_swap_in(routed: Routed) -> None:
    # four shares of 9 GiB fit the 40 GB GPU: the fifth's start swaps the first out, then the
    # least recently used idle one is parked in the background, so that the first's request
    # finds room at once (one copy: its own in) instead of waiting for a victim's copy out
    ninth = {**SHARE, "memory": "9Gi", "compute": 10}
    names = [f"m{i}" for i in range(5)]
    for name in names:
        routed.create(name, **ninth)
        routed.ready(name, timeout=60)
    assert until(lambda: state_of(routed, "m0") == "suspended", timeout=30)
    assert until(lambda: state_of(routed, "m1") == "suspended", timeout=30)
    events = [e["detail"] for e in routed.service("m1")["events"]]
    assert any("swapped out to keep room for service m0" in e for e in events), events
    assert [state_of(routed, name) for name in names[2:]] == ["ready"] * 3
    answer = httpx.get(f"{routed.base}/m0/infer", timeout=90)
    assert answer.status_code == 200, answer.text
    m0 = routed.service("m0")
    assert m0["swaps"]["in"] == 1, m0
    events = [e["detail"] for e in m0["events"]]
    assert not any("waits for room" in e for e in events), events
    # and the room is kept: the least recently used idle one (m2) goes in the background
    assert until(lambda: state_of(routed, "m2") == "suspended", timeout=30)
    assert [state_of(routed, name) for name in ("m0", "m3", "m4")] == ["ready"] * 3


def test_swap_ins_come_back_in_the_order_their_requests_came(routed: Routed) -> None:
    # one 24 GiB model fits: "late" (the newer job) is asked for first, "early" just after;
    # the room freed by swapping "last" out was freed for the first request, whose model it
    # is, not taken by the lower job id asked later (that waited up to a minute under Zipf)
    for name in ("early", "late", "last"):
        routed.create(name, **SHARE)
        routed.ready(name, timeout=60)
    assert until(lambda: state_of(routed, "late") == "suspended", timeout=30)
    assert state_of(routed, "early") == "suspended"
    answered: dict[str, float] = {}

    def ask(name: str) -> None:
        answer = httpx.get(f"{routed.base}/{name}/infer", timeout=90)
        assert answer.status_code == 200, answer.text
        answered[name] = time.monotonic()

    first = threading.Thread(target=ask, args=("late",))
    first.start()
    time.sleep(0.15)
    ask("early")
    first.join()
    assert answered["late"] < answered["early"], answered
