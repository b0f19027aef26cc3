"""The store: one transaction per change, schema versions, nothing half-written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpupool.agent.jobs import JobSpec, State
from gpupool.agent.store import Store
from gpupool.agent.store_db import WAL_LIMIT
from gpupool.agent.store_schema import MIGRATIONS, SCHEMA_VERSION
from gpupool.core.errors import ConfigError, DaemonError, NotFound
from gpupool.core.resources import Priority


def test_a_job_and_its_events_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job = store.add(JobSpec(("echo", "hi"), compute=300, memory="50%"), 1000, "alice")
    store.start(job, (1,), (20 << 30,), "GPUs 1")
    assert store.finish(job.id, State.SUCCEEDED, 0, finished_at=1.0)
    assert not store.finish(job.id, State.FAILED, 1, finished_at=2.0)  # final stays final
    again = Store(tmp_path / "state.db").job(job.id)
    assert again.state is State.SUCCEEDED and again.exit_code == 0 and again.gpus == (1,)
    assert again.spec == job.spec and again.memory_per_gpu() == 20 << 30
    assert [e["kind"] for e in store.events(job.id)] == ["submitted", "placed", "succeeded"]
    with pytest.raises(NotFound):
        store.job(job.id + 1)


def test_the_schema_version_is_recorded_and_a_newer_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="newer than this gpupool"):
        Store(path)


def test_a_failed_transaction_changes_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with pytest.raises(RuntimeError), store.transaction() as db:
        db.execute("INSERT INTO settings (key, value) VALUES ('draining', '1')")
        raise RuntimeError("disk full")
    assert store.setting("draining") is None


def test_a_store_that_cannot_be_written_is_one_error_and_unchanged(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add(JobSpec(("true",)), 0, "root")
    # the disk is full: SQLite may not grow the database by a single page
    store._db.execute("PRAGMA max_page_count = 1")
    with pytest.raises(DaemonError, match="cannot write its state"):
        for _ in range(200):
            store.add(JobSpec(("true", "x" * 1000)), 0, "root")
    assert len(store.jobs()) >= 1
    before = len(store.jobs())
    with pytest.raises(DaemonError):
        store.add(JobSpec(("true", "y" * 5000)), 0, "root")
    assert len(store.jobs()) == before


def test_a_first_version_store_gains_the_watchdog_events_and_keeps_its_jobs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
    db.execute(
        "INSERT INTO jobs (spec, uid, user, state, rank, submitted_at) VALUES (?, 0, 'a', ?, 0, 1)",
        (json.dumps(JobSpec(("true",)).to_json()), State.QUEUED.value),
    )
    db.execute("INSERT INTO events (job_id, at, kind) VALUES (1, 2.0, 'over_share')")
    db.commit()
    db.close()
    store = Store(path)
    assert store.job(1).state is State.QUEUED
    store.node_event("no_job", 42, 0, "GPU 0: pid 42 (x) belongs to no job, 1GiB")
    events = store.node_events(("over_share",))
    assert [(e["kind"], e["job_id"], e["pid"]) for e in events] == [
        ("over_share", 1, None),
        ("no_job", None, 42),
    ]
    assert store.job_ids_with("over_share") == {1}
    assert store.node_events(("over_share",), limit=1)[0]["kind"] == "no_job"  # the newest


def test_recent_events_span_jobs_newest_first(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    first = store.add(JobSpec(("true",)), 1000, "alice")
    second = store.add(JobSpec(("true",)), 1001, "bob")
    store.note(first.id, "oom", "refused 1GiB")
    recent = store.recent_events(limit=2)
    assert [(e["job_id"], e["kind"]) for e in recent] == [
        (first.id, "oom"),
        (second.id, "submitted"),
    ]
    assert recent[0]["detail"] == "refused 1GiB" and recent[0]["at"] >= recent[1]["at"]
    assert len(store.recent_events()) == 3


def test_a_stored_spec_is_parsed_once_and_each_job_keeps_its_own(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    first = store.add(JobSpec(("sleep", "60"), compute=300, env={"A": "1"}), 1000, "alice")
    second = store.add(JobSpec(("sleep", "60"), compute=500, env={"A": "2"}), 1000, "alice")
    read = {job.id: job.spec for job in store.jobs([State.QUEUED])}
    again = {job.id: job.spec for job in store.jobs([State.QUEUED])}
    # the queue loop and every /metrics scrape read the live jobs: no parse and check each time
    assert read[first.id] is again[first.id] and store.job(first.id).spec is read[first.id]
    assert read[first.id] == first.spec and read[second.id] == second.spec
    assert read[second.id].env == {"A": "2"} and read[second.id].compute == 500


def test_jobs_among_reads_the_named_jobs_in_the_states_asked_in_queue_order(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "state.db")
    low = JobSpec(("true",), priority=Priority.LOW)
    jobs = [store.add(low if i % 3 == 0 else JobSpec(("true",)), 1000, "alice") for i in range(700)]
    store.start(jobs[1], (0,), (0,), "GPU 0")  # running: not among the queued
    named = {job.id for job in jobs[::2]} | {jobs[1].id, 10_000}  # past one IN (...), one unknown
    found = store.jobs_among(named, [State.QUEUED])
    expected = sorted(
        (job for job in jobs[::2]), key=lambda job: (job.spec.priority is Priority.LOW, job.id)
    )
    assert [job.id for job in found] == [job.id for job in expected]
    assert [job.id for job in store.jobs_among({jobs[1].id}, [State.RUNNING])] == [jobs[1].id]
    assert store.jobs_among(set(), [State.QUEUED]) == []


def test_a_job_is_stored_with_its_settings_or_neither(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    job = store.add(JobSpec(("true",)), 1000, "alice", settings={"window": "[1]"})
    assert store.setting("window") == "[1]" and store.job(job.id).user == "alice"
    with pytest.raises(DaemonError):  # a job that cannot be stored: no setting either
        store.add(JobSpec(("true",)), None, "alice", settings={"window": "[2]"})  # type: ignore[arg-type]
    assert store.setting("window") == "[1]"
    assert [j.id for j in store.jobs()] == [job.id]


def test_has_jobs_says_whether_any_job_is_in_the_states_asked(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    assert not store.has_jobs([State.QUEUED, State.RUNNING])
    job = store.add(JobSpec(("true",)), 1000, "alice")
    assert store.has_jobs([State.QUEUED]) and not store.has_jobs([State.RUNNING])
    store.start(job, (0,), (0,), "GPU 0")
    assert store.has_jobs([State.QUEUED, State.RUNNING]) and not store.has_jobs([State.QUEUED])


def test_the_wal_is_cut_back_after_a_burst(tmp_path: Path) -> None:
    """A burst of writes while a reader holds its snapshot (a listing) grows the WAL past its
    checkpoint size; once the reader is gone and a checkpoint has run, the WAL is cut back, so
    a burst does not hold the store's size for the daemon's life."""
    path = tmp_path / "state.db"
    store = Store(path)
    store._db.execute("CREATE TABLE filler (data BLOB)")
    reader = sqlite3.connect(path)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM jobs").fetchone()  # a snapshot no checkpoint passes
    for _ in range(40):
        store._db.execute("INSERT INTO filler VALUES (zeroblob(256 * 1024))")
    wal = path.with_name("state.db-wal")
    assert wal.stat().st_size > 2 * WAL_LIMIT
    reader.rollback()
    reader.close()
    for _ in range(3):  # the checkpoint, then a write that starts the WAL again
        store.add(JobSpec(("true",)), 0, "root")
    assert wal.stat().st_size <= WAL_LIMIT
