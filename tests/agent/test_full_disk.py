"""A job that ends while the disk is full keeps its exit status (issue 35, smaller ones): the
state dir is a small tmpfs of its own, filled to the last byte while the job runs; its
supervisor keeps the status and writes it when space returns, and the daemon records the real
exit code, not "exit code unknown", meanwhile leaving the job running."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import Daemon, until

from gpupool.agent.jobdir import alive

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    """tmp_path/state: a 16 MiB tmpfs, 0700 (as a state dir must be), unmounted after."""
    state = tmp_path / "state"
    state.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(state)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def _fill(directory: Path) -> Path:
    """A file that takes every byte left on `directory`'s filesystem."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as err:
                    assert err.errno == errno.ENOSPC, err
                    break
    finally:
        os.close(fd)
    return filler


def test_an_exit_status_on_a_full_disk_is_written_when_space_returns(
    small_state: Path, tmp_path: Path
) -> None:
    daemon = Daemon(tmp_path, "1xA30").start()
    assert daemon.state_dir == small_state
    try:
        job_id = daemon.submit(["sh", "-c", "sleep 2; exit 7"], memory="1Gi", compute=10)
        jobdir = daemon.state_dir / "jobs" / str(job_id)
        assert until(lambda: (jobdir / "pids.json").exists(), 20)
        filler = _fill(daemon.state_dir)
        time.sleep(5)  # the job has ended meanwhile, its status refused by the full disk
        assert not (jobdir / "exit.json").exists()
        pids = json.loads((jobdir / "pids.json").read_text())
        assert alive(pids["supervisor"], pids["supervisor_start"]), "the supervisor gave up"
        assert not alive(pids["job"], pids["job_start"])
        assert daemon.job(job_id)["state"] == "running"  # not "exit code unknown"
        filler.unlink()
        ended = daemon.wait(job_id, timeout=30)
        assert (ended["state"], ended["exit_code"]) == ("failed", 7), ended
        events = [e["detail"] for e in ended["events"]]
        assert not any("unknown" in detail for detail in events), events
    finally:
        with contextlib.suppress(Exception):
            (daemon.state_dir / "filler").unlink(missing_ok=True)
        daemon.stop()
        _kill_jobs(daemon)


def _launched_unrecorded(daemon: Daemon) -> int | None:
    """A job whose supervisor has written pids.json while the daemon, stopped (SIGSTOP) just
    after it started the job, has not recorded it as launched yet; None when the daemon was
    quicker (the race this needs is lost)."""
    assert daemon.process is not None
    job_id = daemon.submit(["sh", "-c", "sleep 3; exit 7"], memory="1Gi", compute=10)
    assert until(lambda: daemon.job(job_id)["state"] == "running", 20)
    daemon.process.send_signal(signal.SIGSTOP)
    pids = daemon.state_dir / "jobs" / str(job_id) / "pids.json"
    deadline = time.monotonic() + 20
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # time for a supervisor the daemon started to write it
        if not pids.exists():  # not started yet: let the daemon on a little
            daemon.process.send_signal(signal.SIGCONT)
            time.sleep(0.002)
            daemon.process.send_signal(signal.SIGSTOP)
    db = sqlite3.connect(f"file:{daemon.state_dir / 'state.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT job_pid FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        db.close()
    if row[0] is not None:
        daemon.process.send_signal(signal.SIGCONT)
        daemon.wait(job_id)
        return None
    return job_id


def test_a_full_disk_fails_no_running_job_for_its_bookkeeping(
    small_state: Path, tmp_path: Path
) -> None:
    daemon = Daemon(tmp_path, "1xA30").start()
    assert daemon.process is not None
    try:
        for _ in range(5):
            job_id = _launched_unrecorded(daemon)
            if job_id is not None:
                break
        else:
            pytest.skip("the daemon recorded every launch before it could be stopped")
        filler = _fill(daemon.state_dir)
        daemon.process.send_signal(signal.SIGCONT)
        time.sleep(2)  # passes that cannot record the launch: the job must go on
        assert daemon.job(job_id)["state"] == "running"
        pids = json.loads((daemon.state_dir / "jobs" / str(job_id) / "pids.json").read_text())
        assert alive(pids["job"], pids["job_start"]), "the job was killed for the full disk"
        filler.unlink()
        ended = daemon.wait(job_id, timeout=30)
        assert (ended["state"], ended["exit_code"]) == ("failed", 7), ended
    finally:
        with contextlib.suppress(Exception):
            (daemon.state_dir / "filler").unlink(missing_ok=True)
            daemon.process.send_signal(signal.SIGCONT)
        daemon.stop()
        _kill_jobs(daemon)
