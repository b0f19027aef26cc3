"""Two users' compute shares on one GPU at once, through the socket group, on a host with
systemd's fs.protected_regular=1: both run, each as its own user, and each sees only its own."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, until
from tests.agent.multiuser_support import group_daemon
from tests.users import (
    User,
    gpupool_as,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")


def _protected_regular() -> bool:
    return Path("/proc/sys/fs/protected_regular").read_text().strip() != "0"


@pytest.fixture
def two_users() -> Iterator[tuple[Daemon, User, User]]:
    with group_daemon("1xA100-40GB") as (daemon, (alice, bob)):
        yield daemon, alice, bob


def _submit(daemon: Daemon, user: User, compute: str, seconds: str) -> int:
    done = gpupool_as(
        user,
        "submit",
        "--compute",
        compute,
        "--memory",
        "4Gi",
        "--",
        "python3",
        CUDA_JOB,
        seconds,
        "512",
        url=daemon.url,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.serial
def test_two_users_compute_shares_run_together_on_one_gpu(
    two_users: tuple[Daemon, User, User],
) -> None:
    if not _protected_regular():
        pytest.fail("run with fs.protected_regular=1 (as .ci/run sets it): real hosts have it")
    daemon, alice, bob = two_users
    ids = {alice.name: _submit(daemon, alice, "30", "4"), bob.name: _submit(daemon, bob, "70", "4")}

    def both_running() -> bool:
        jobs = {job["id"]: job for job in daemon.call("GET", "/v1/jobs")["jobs"]}
        return all(jobs.get(i, {}).get("state") == "running" for i in ids.values())

    assert until(both_running), daemon.call("GET", "/v1/jobs")

    def finished() -> list[dict[str, object]]:
        jobs = daemon.call("GET", "/v1/jobs?all=true")["jobs"]
        done = [job for job in jobs if job["id"] in ids.values() and job["state"] != "running"]
        return done if len(done) == len(ids) else []

    ended = until(finished, timeout=60)
    assert [job["state"] for job in ended] == ["succeeded", "succeeded"], [
        (job["id"], job.get("detail"), daemon.call("GET", f"/v1/jobs/{job['id']}/logs"))
        for job in ended
    ]
    for user in (alice, bob):
        job_id = ids[user.name]
        log = daemon.state_dir / "jobs" / str(job_id) / "stderr"
        found = os.lstat(log)
        assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (user.uid, 0o600)
        mine = gpupool_as(user, "logs", str(job_id), url=daemon.url)
        assert mine.returncode == 0, mine.stderr
        other = ids[bob.name if user is alice else alice.name]
        theirs = gpupool_as(user, "logs", str(other), url=daemon.url)
        assert theirs.returncode == 6 and "belongs to" in theirs.stderr, theirs
