"""Elastic memory between real Unix users: another user's job cannot be suspended, resumed or
resized (one line, nothing changed), and the owner's suspend and resume work through the root
daemon, which writes the request into a region its user owns."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, until
from tests.agent.multiuser_support import group_daemon
from tests.users import User, gpupool_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")


@pytest.fixture
def two_users() -> Iterator[tuple[Daemon, User, User]]:
    with group_daemon("1xA100-40GB") as (daemon, (alice, bob)):
        yield daemon, alice, bob


def _state(daemon: Daemon, job: int) -> str:
    shown = daemon.job(job).get("elastic")
    return "running" if shown is None else str(shown["state"])


def test_only_the_owner_suspends_resumes_or_resizes(two_users: tuple[Daemon, User, User]) -> None:
    daemon, alice, bob = two_users
    done = gpupool_as(
        alice, "submit", "--memory", "4Gi", "--compute", "50", "--", "python3", CUDA_JOB, "20",
        "2048", url=daemon.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = int(done.stdout)
    assert until(lambda: (daemon.job(job).get("live_memory") or 0) >= 2 << 30)
    for args in (("suspend", str(job)), ("resume", str(job)), ("resize", str(job), "--compute",
                                                               "60")):  # fmt: skip
        refused = gpupool_as(bob, *args, url=daemon.url)
        assert refused.returncode != 0
        assert f"job {job} belongs to {alice.name}" in refused.stderr
        assert refused.stderr.count("\n") == 1
    assert _state(daemon, job) == "running" and daemon.job(job)["compute"] == 50
    assert gpupool_as(alice, "suspend", str(job), url=daemon.url).returncode == 0
    assert until(lambda: _state(daemon, job) == "suspended", 10)
    assert gpupool_as(alice, "resume", str(job), url=daemon.url).returncode == 0
    assert until(lambda: _state(daemon, job) == "running", 10)
    grown = gpupool_as(alice, "resize", str(job), "--compute", "60", url=daemon.url)
    assert grown.returncode == 0, grown.stderr
    assert daemon.job(job)["compute"] == 60
    daemon.call("POST", f"/v1/jobs/{job}/cancel", json={})
