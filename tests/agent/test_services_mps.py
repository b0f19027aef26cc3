"""Services in mode mps. Two online services on one GPU, one of them kept busy: in mode mps the
other's requests take as long as alone (their kernels run beside the busy one's on SMs of their
own), in mode shim they wait for their turns; and a killed MPS server's replicas are replaced.
A real daemon on a simulated node, real replicas, real HTTP through the router; each request's
time is the one the model server measured around its kernels."""

from __future__ import annotations

import os
import signal
import statistics
import time

import httpx
import pytest
from tests.agent.daemon_support import until
from tests.agent.services_support import Load, Routed, routed_on

routed = routed_on("1xA100-40GB")

#: a batch-1 model's request: 8 kernels of 16 blocks (16 of the A100's 108 SMs), 0.5 ms each
NARROW = ("--blocks", "16", "--threads", "1024", "--kernels", "8")


def median_ms(routed: Routed, name: str, requests: int = 40) -> float:
    """The median of `requests` requests' GPU time, 20 ms apart: well inside the service's
    compute share (4 ms of 24), which would otherwise hold back requests sent back to back."""
    with httpx.Client(timeout=30) as client:
        times = []
        for _ in range(requests):
            answer = client.get(f"{routed.base}/{name}/infer")
            assert answer.status_code == 200, answer.text
            times.append(float(answer.json()["ms"]))
            time.sleep(0.02)
    return statistics.median(times)


@pytest.mark.serial
@pytest.mark.parametrize("mode", ["mps", "shim"])
def test_a_busy_online_service_slows_its_neighbour_only_when_they_take_turns(
    routed: Routed, mode: str
) -> None:
    for name, compute in (("quiet", 40), ("busy", 60)):
        routed.create(name, *NARROW, priority="high", compute=compute, mode=mode, concurrency=4)
    routed.ready("quiet")
    routed.ready("busy")
    alone = median_ms(routed, "quiet")
    # two clients back to back, 40 kernels a request: the busy service never leaves the GPU
    with Load(f"{routed.base}/busy/infer?kernels=40", workers=2).running() as load:
        beside = median_ms(routed, "quiet")
    assert load.statuses[200] >= 5 and set(load.statuses) == {200}, load.statuses
    if mode == "mps":
        assert beside < 1.2 * alone, (beside, alone)
    else:  # time-sliced: the quiet service's kernels wait for the busy one's turns
        assert beside > 1.3 * alone, (beside, alone)


def test_a_killed_mps_server_takes_its_replicas_and_the_service_starts_new_ones(
    routed: Routed,
) -> None:
    routed.create("chat", *NARROW, priority="high", compute=40, mode="mps")
    before = routed.ready("chat")["replica_list"][0]["job_id"]
    server = routed.daemon.job(before)["mps_server"]
    assert server, routed.daemon.job(before)
    os.kill(server, signal.SIGKILL)
    # the daemon fails every client of the dead server; the service manager replaces its replica
    assert until(lambda: routed.daemon.job(before)["state"] == "failed", timeout=20)
    after = until(
        lambda: (
            (s := routed.service("chat"))["replicas"]["ready"] == 1
            and s["replica_list"][0]["job_id"] != before
            and s
        ),
        timeout=30,
    )
    assert after, routed.service("chat")
    replaced = routed.daemon.job(after["replica_list"][0]["job_id"])
    assert replaced["mps_server"] not in (None, server)
    answer = httpx.get(f"{routed.base}/chat/infer", timeout=30)
    assert answer.status_code == 200, answer.text
