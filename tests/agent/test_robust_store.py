"""The daemon's state under trouble: a corrupt database stops `serve` in one line (exit 2), and
a database locked by another process answers 503 with Retry-After within a second or two
instead of blocking the daemon."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from tests.agent.daemon_support import Daemon

from gpupool.agent.jobs import JobSpec
from gpupool.agent.store import Store
from gpupool.core.errors import ConfigError, StoreBusy


def corrupt_an_index(path: Path) -> None:
    """Garbage over the root page of the jobs' state index; the table itself stays readable."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs_state'").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with path.open("r+b") as file:
        file.seek((root - 1) * size)
        file.write(b"\xa5" * size)
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA quick_check").fetchall() != [("ok",)]
    check.close()


def test_a_corrupt_store_stops_serve_with_one_line_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    store = Store(state / "state.db")
    for _ in range(20):
        store.add(JobSpec(("true",)), 0, "root")
    store.close()
    corrupt_an_index(state / "state.db")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gpupool", "serve", "--simulate", "1xA100-40GB"),
            *("--node-dir", str(tmp_path / "node"), "--state-dir", str(state)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"gpupool: error: the state database {state / 'state.db'} is corrupt"
    )
    assert "quick_check: Page " in lines[0]
    assert "move it aside" in lines[0]


def test_a_file_that_is_no_database_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"not a database at all" * 500)
    with pytest.raises(ConfigError, match=r"^cannot open the state database .*: file is not a"):
        Store(path)


def hold_write_lock(path: Path, seconds: float) -> threading.Thread:
    """Another connection (as another process would) holds the write lock for `seconds`."""
    taken = threading.Event()

    def hold() -> None:
        db = sqlite3.connect(path, isolation_level=None, timeout=10)
        db.execute("BEGIN EXCLUSIVE")
        taken.set()
        time.sleep(seconds)
        db.execute("ROLLBACK")
        db.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    return thread


def test_a_locked_store_answers_503_with_retry_after_at_once(daemon: Daemon) -> None:
    before = daemon.submit(["true"])
    daemon.wait(before)
    transport = httpx.HTTPTransport(uds=str(daemon.state_dir / "gpupool.sock"))
    holder = hold_write_lock(daemon.state_dir / "state.db", 6)
    try:
        with httpx.Client(transport=transport, base_url="http://gpupool", timeout=30) as client:
            began = time.monotonic()
            answer = client.post("/v1/jobs", json={"argv": ["true"], "workdir": "/"})
            took = time.monotonic() - began
            assert answer.status_code == 503
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["error"] == "StoreBusy"
            assert "try again" in answer.json()["message"]
            assert took < 2.0
            # reads go on (WAL), and the daemon's health does not wait on the store
            began = time.monotonic()
            assert client.get("/v1/health").status_code == 200
            listed = client.get("/v1/jobs", params={"all": "true"})
            assert time.monotonic() - began < 2.0
            assert listed.status_code in (200, 503)
            if listed.status_code == 200:
                assert [job["id"] for job in listed.json()["jobs"]] == [before]
    finally:
        holder.join()
    later = daemon.submit(["true"])  # nothing was stored while locked; now it is
    assert later == before + 1
    assert daemon.wait(later)["state"] == "succeeded"


def test_submits_waiting_on_a_locked_store_leave_the_api_answering(daemon: Daemon) -> None:
    # the submits wait for the store's lock off the event loop: everyone else is still served
    def connected() -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(daemon.state_dir / "gpupool.sock"))
        return httpx.Client(transport=transport, base_url="http://gpupool", timeout=30)

    holder = hold_write_lock(daemon.state_dir / "state.db", 4)
    answers: list[int] = []

    def submit() -> None:
        with connected() as client:
            answers.append(client.post("/v1/jobs", json={"argv": ["true"]}).status_code)

    submitters = [threading.Thread(target=submit) for _ in range(4)]
    try:
        for thread in submitters:
            thread.start()
        time.sleep(0.2)  # the submits are in, waiting on the lock (0.5 s each, one at a time)
        slowest = 0.0
        with connected() as client:
            while any(thread.is_alive() for thread in submitters):
                began = time.monotonic()
                assert client.get("/v1/health").status_code == 200
                slowest = max(slowest, time.monotonic() - began)
                time.sleep(0.02)
        assert slowest < 0.3
        assert answers == [503] * 4
    finally:
        holder.join()
        for thread in submitters:
            thread.join()


def test_the_store_raises_store_busy_within_its_timeouts(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    holder = hold_write_lock(tmp_path / "state.db", 3)
    try:
        began = time.monotonic()
        with pytest.raises(StoreBusy, match="locked by another process"):
            store.add(JobSpec(("true",)), 0, "root")
        assert time.monotonic() - began < 1.5
        assert store.jobs() == []
    finally:
        holder.join()
    store.add(JobSpec(("true",)), 0, "root")
    assert len(store.jobs()) == 1
