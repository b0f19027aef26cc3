"""A real daemon serving real users: the job files' owners and modes, what another user can
read, and what a job can do to the daemon through its files and its output (nothing)."""

from __future__ import annotations

import json
import re
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import CUDA_JOB, Daemon, scrape, until
from tests.agent.multiuser_support import group_daemon
from tests.users import (
    User,
    gpupool_as,
    remove_tree,
    run_as,
    world_dir,
)

from gpupool.agent.jobs import JobSpec
from gpupool.agent.store import Store

MiB = 1 << 20


@dataclass
class Shared:
    """A daemon whose state dir is 0750 root:GROUP (a socket group's layout), and two members."""

    daemon: Daemon
    alice: User
    bob: User

    def submit(self, user: User, *argv: str, share: tuple[str, ...] = ("--compute", "10")) -> int:
        done = gpupool_as(user, "submit", *share, "--", *argv, url=self.daemon.url)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    def jobdir(self, job_id: int) -> Path:
        return self.daemon.state_dir / "jobs" / str(job_id)


@pytest.fixture
def shared() -> Iterator[Shared]:
    with group_daemon("1xA100-40GB") as (daemon, (alice, bob)):
        yield Shared(daemon, alice, bob)


def _owned(path: Path) -> tuple[int, int]:
    found = path.lstat()
    assert stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode), path
    return found.st_uid, stat.S_IMODE(found.st_mode)


def test_the_files_of_a_users_job_are_the_daemons_but_its_logs(shared: Shared) -> None:
    daemon, alice = shared.daemon, shared.alice
    job = shared.submit(alice, "sh", "-c", "echo out; echo err >&2; exec sleep 60")
    state, jobdir = daemon.state_dir, shared.jobdir(job)
    assert until(lambda: (jobdir / "stderr").exists() and (jobdir / "stderr").read_text())
    assert _owned(state) == (0, 0o750)
    for name in ("state.db", "state.db-wal", "state.db-shm", "daemon.lock"):
        assert _owned(state / name) == (0, 0o600), name
    assert _owned(state / "jobs") == (0, 0o711)
    assert _owned(jobdir) == (0, 0o711)
    for name in ("launch.json", "claim", "pids.json"):
        assert _owned(jobdir / name) == (0, 0o600), name
    for name, text in (("stdout", "out\n"), ("stderr", "err\n")):
        assert _owned(jobdir / name) == (alice.uid, 0o600)
        assert (jobdir / name).read_text() == text
    [share] = [p for p in jobdir.iterdir() if p.name.startswith("gpupool-share-")]
    assert _owned(share) == (alice.uid, 0o700)
    # the job's user reads its logs; another member of the group, nothing of the job's
    assert run_as(alice, ["cat", str(jobdir / "stdout")]).stdout == "out\n"
    for path in (jobdir / "stdout", jobdir / "stderr", jobdir / "launch.json", share):
        seen = run_as(shared.bob, ["cat", str(path / "region" if path == share else path)])
        assert seen.returncode != 0 and "Permission denied" in seen.stderr, path
    for path in (state / "jobs", jobdir):
        listed = run_as(alice, ["ls", str(path)])
        assert listed.returncode != 0 and "Permission denied" in listed.stderr, path
    daemon.call("POST", f"/v1/jobs/{job}/cancel", json={})
    daemon.wait(job)
    assert _owned(jobdir / "exit.json") == (0, 0o600)


def test_a_planted_link_at_a_jobs_log_is_replaced_never_followed() -> None:
    """An older state dir (another user could prepare one) may hold links where the logs go:
    the supervisor removes them and makes the log anew, and the link's target is untouched.
    (The job is in the store, queued: a directory of an id the store never assigned would stop
    the daemon before anything, test_store_missing.py.)"""
    root = world_dir()
    try:
        secret = root / "secret"
        secret.write_text("root only\n")
        secret.chmod(0o600)
        planted = root / "state" / "jobs" / "1"
        planted.mkdir(parents=True, mode=0o700)
        store = Store(root / "state" / "state.db")
        store.add(JobSpec(("echo", "hi")), 0, "root")
        store.close()
        (planted / "stdout").symlink_to(secret)
        (planted / "stderr").symlink_to(secret)
        daemon = Daemon(root, "1xA100-40GB").start()
        try:
            assert daemon.wait(1)["state"] == "succeeded"
        finally:
            daemon.stop()
            _kill_jobs(daemon)
        assert secret.read_text() == "root only\n" and _owned(secret) == (0, 0o600)
        assert (planted / "stdout").read_text() == "hi\n"
        assert _owned(planted / "stdout") == (0, 0o600) and _owned(planted) == (0, 0o711)
    finally:
        remove_tree(root)


def test_a_fifo_for_an_accounting_region_never_stalls_metrics(shared: Shared) -> None:
    daemon = shared.daemon
    script = (
        "import os, time\n"
        "region = os.environ['GPUPOOL_SHARED_REGION']\n"
        "if os.path.exists(region): os.unlink(region)\n"
        "os.mkfifo(region)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = shared.submit(shared.alice, sys.executable, "-c", script)
    out = shared.jobdir(job) / "stdout"
    assert until(lambda: out.exists() and out.read_text() == "ready\n", 30)
    for _ in range(3):
        began = time.monotonic()
        samples = scrape(daemon)
        assert time.monotonic() - began < 2
        assert samples["gpupool_up"] == [({}, 1.0)]
    daemon.call("POST", f"/v1/jobs/{job}/cancel", json={})


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_job_flooding_stderr_without_a_newline_costs_the_daemon_nothing(
    shared: Shared,
) -> None:
    """64 MiB on stderr in one line, then the interception library's out-of-memory line: the
    mark is recorded, and the daemon's peak memory grows by less than 50 MiB."""
    daemon = shared.daemon
    assert daemon.process is not None
    warm = shared.submit(shared.alice, "true")  # the daemon's first job costs what it costs
    daemon.wait(warm)
    Path(f"/proc/{daemon.process.pid}/clear_refs").write_text("5")  # reset the peak
    before = _peak_rss(daemon.process.pid)
    flood = f"head -c {64 * MiB} /dev/zero | tr '\\0' x >&2; exec {sys.executable} {CUDA_JOB}"
    job = shared.submit(
        shared.alice,
        "sh",
        "-c",
        f"{flood} 0.2 512 4096",
        share=("--memory", "2GiB", "--compute", "10"),
    )
    ended = daemon.wait(job, timeout=120)
    grown = _peak_rss(daemon.process.pid) - before
    print(f"daemon peak RSS grew by {grown / MiB:.1f} MiB")
    assert ended["state"] == "failed" and ended["exit_code"] == 2 and ended["oom"]
    assert grown < 50 * MiB
    log = shared.jobdir(job) / "stderr"
    assert log.stat().st_size > 64 * MiB
    with log.open("rb") as err:
        err.seek(64 * MiB)
        assert re.search(rb"gpupool\[\d+\]: out of memory on device 0", err.read())


def test_a_job_whose_child_keeps_its_output_open_ends_at_its_own_exit(shared: Shared) -> None:
    """The job exits 5 and leaves a daemon holding stdout: the job ends then; the supervisor
    goes on writing what the daemon prints until it closes its output."""
    daemon = shared.daemon
    script = "(sleep 3; echo late) & echo early; exit 5"
    job = shared.submit(shared.alice, "sh", "-c", script)
    began = time.monotonic()
    ended = daemon.wait(job, timeout=30)
    assert ended["exit_code"] == 5 and time.monotonic() - began < 3
    stdout = shared.jobdir(job) / "stdout"
    assert until(lambda: stdout.read_text() == "early\nlate\n", 20)
    pids = json.loads((shared.jobdir(job) / "pids.json").read_text())
    assert until(lambda: not _alive(pids["supervisor"]), 10)  # it leaves with the last writer


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()
