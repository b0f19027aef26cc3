"""The store is never silently replaced (issue 35, item 9): with state.db missing, empty or older
than the job directories beside it, `serve` stops with one line saying what to do (restore it,
or move the jobs directory aside) and deletes nothing; and pruning never removes a directory of
a job the store never assigned."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.agent.daemon_support import Daemon

from gpupool.agent.jobdir import remove_unknown

DB_FILES = ("state.db", "state.db-wal", "state.db-shm")


def _ran_jobs(root: Path, count: int) -> Daemon:
    """A daemon that ran `count` jobs, each of which printed its number; stopped."""
    daemon = Daemon(root, "1xA30").start()
    try:
        for number in range(count):
            daemon.wait(daemon.submit(["echo", f"job-{number}"], memory="1Gi", compute=10))
    finally:
        daemon.stop()
    return daemon


def _serve(daemon: Daemon) -> subprocess.CompletedProcess[str]:
    """`gpupool serve` on the daemon's state dir, for at most 20 s (it must stop by itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    args = ["--node-dir", str(daemon.node_dir), "--state-dir", str(daemon.state_dir)]
    try:
        return subprocess.run(
            [sys.executable, "-m", "gpupool", "serve", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("serve started (and would prune the job directories it does not know)")


def _logs(daemon: Daemon) -> dict[str, str]:
    jobs = daemon.state_dir / "jobs"
    return {path.parent.name: path.read_text() for path in sorted(jobs.glob("*/stdout"))}


@pytest.mark.parametrize("how", ["missing", "empty"])
def test_serve_stops_in_one_line_beside_job_directories_and_deletes_nothing(
    tmp_path: Path, how: str
) -> None:
    daemon = _ran_jobs(tmp_path, 3)
    before = _logs(daemon)
    assert before == {"1": "job-0\n", "2": "job-1\n", "3": "job-2\n"}
    for name in DB_FILES:
        (daemon.state_dir / name).unlink(missing_ok=True)
    if how == "empty":
        (daemon.state_dir / "state.db").touch(mode=0o600)
    done = _serve(daemon)
    assert done.returncode == 2, done.stderr
    jobs, database = daemon.state_dir / "jobs", daemon.state_dir / "state.db"
    assert done.stderr.splitlines() == [
        f"gpupool: error: {jobs} holds 3 job directories (ids 1 to 3) that the state database "
        f"never assigned ({database} is {how}): restore the state.db that goes with them (with "
        f"its -wal and -shm files), or move the directory aside (mv {jobs} {jobs}.old) to start "
        "anew; nothing was deleted"
    ]
    assert _logs(daemon) == before
    assert database.exists() == (how == "empty")  # nothing made in its place either
    # moved aside as told: the daemon starts anew, and the old jobs are all still there
    jobs.rename(f"{jobs}.old")
    fresh = Daemon(tmp_path, "1xA30").start()
    try:
        assert fresh.call("GET", "/v1/jobs", params={"all": True})["jobs"] == []
    finally:
        fresh.stop()
    assert len(list(Path(f"{jobs}.old").glob("*/stdout"))) == 3


def test_serve_stops_on_a_store_older_than_its_job_directories(tmp_path: Path) -> None:
    daemon = _ran_jobs(tmp_path, 1)
    backup = tmp_path / "backup"
    backup.mkdir()
    for name in DB_FILES:
        if (daemon.state_dir / name).exists():
            shutil.copy2(daemon.state_dir / name, backup / name)
    daemon.start()
    daemon.wait(daemon.submit(["echo", "after the backup"], memory="1Gi", compute=10))
    daemon.stop()
    for name in DB_FILES:
        (daemon.state_dir / name).unlink(missing_ok=True)
        if (backup / name).exists():
            shutil.copy2(backup / name, daemon.state_dir / name)
    done = _serve(daemon)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert "holds 1 job directories (ids 2 to 2)" in line
    assert "(the newest it assigned is 1)" in line
    assert _logs(daemon) == {"1": "job-0\n", "2": "after the backup\n"}


def test_pruning_keeps_a_directory_the_store_never_assigned(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for job_id in (1, 2, 5, 9):
        (jobs / str(job_id)).mkdir(parents=True)
        (jobs / str(job_id) / "stdout").write_text(f"{job_id}\n")
    started = time.monotonic()
    # the store holds job 2 and assigned up to 5: 1 and 5 were pruned, 9 is not its own
    remove_unknown(jobs, lambda: {2}, lambda: 5)
    assert time.monotonic() - started < 5
    assert sorted(path.name for path in jobs.iterdir()) == ["2", "9"]
    assert (jobs / "9" / "stdout").read_text() == "9\n"
