"""Replicas of one service spread over GPUs, services pack: a real daemon on a simulated node of
2 GPUs under the node's default policy (replicas place with binpack, which without the spread
rule puts every replica on GPU 0), real replicas, and the spread kept across a daemon killed
with -9."""

from __future__ import annotations

from pathlib import Path

from tests.agent.conftest import _kill_jobs
from tests.agent.services_support import Routed, routed_on, start_routed

routed = routed_on()


def gpus_of(routed: Routed) -> dict[str, list[int]]:
    """The GPU each running replica is on, by service."""
    jobs = routed.daemon.call("GET", "/v1/jobs")["jobs"]
    placed: dict[str, list[int]] = {}
    for job in jobs:
        if job["state"] == "running":
            placed.setdefault(job["name"].split("/")[0], []).extend(job["gpus"])
    return {name: sorted(gpus) for name, gpus in placed.items()}


def test_a_services_replicas_spread_while_services_pack(routed: Routed, tmp_path: Path) -> None:
    routed.create("chat", min_replicas=2, max_replicas=2)
    routed.ready("chat", 2)
    routed.create("one")
    routed.ready("one")
    routed.create("two")
    routed.ready("two")
    placed = gpus_of(routed)
    assert placed["chat"] == [0, 1], placed
    assert placed["one"] == placed["two"], placed  # two services pack onto one GPU
    # the group is stored with each replica's job: after a kill -9 and a restart, a new
    # replica of `one` leaves the GPU its first replica is on, the fuller one
    routed.daemon.kill()
    again = start_routed(tmp_path)
    try:
        again.ready("one")
        again.daemon.call(
            "POST", "/v1/services/one/scale", json={"min_replicas": 2, "max_replicas": 2}
        )
        again.ready("one", 2)
        after = gpus_of(again)
        assert after["one"] == [0, 1], after
    finally:
        again.daemon.stop()
        _kill_jobs(again.daemon)
