"""Pruning: finished jobs, their events and directories go after an age (`gpupool prune`, or
the daemon's loop after keep_finished_s); node events are capped; prune is for admins."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests import users
from tests.agent.daemon_support import Daemon, cli, until
from tests.agent.multiuser_support import group_daemon

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import JobSpec, State
from gpupool.agent.store import Store
from gpupool.agent.store_events import MAX_JOB_EVENTS, MAX_NODE_EVENTS
from gpupool.agent.store_schema import MIGRATIONS
from gpupool.api.app import PEER_UID, create_app
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import parse_duration
from gpupool.devices.factory import open_backend

DAY = 86400.0


def count(daemon: Daemon, query: str) -> int:
    db = sqlite3.connect(daemon.state_dir / "state.db", timeout=10)
    try:
        return int(db.execute(query).fetchone()[0])
    finally:
        db.close()


def test_prune_by_age_removes_jobs_events_and_directories_only(daemon: Daemon) -> None:
    old, new = daemon.submit(["true"]), daemon.submit(["true"])
    for job_id in (old, new):
        daemon.wait(job_id)
    jobs_dir = daemon.state_dir / "jobs"
    assert (jobs_dir / str(old) / "stdout").exists()
    # a link the job's owner left in its directory: pruning removes the link, not its target
    outside = daemon.root / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    (jobs_dir / str(old) / "escape").symlink_to(outside)
    db = sqlite3.connect(daemon.state_dir / "state.db", timeout=10)
    with db:
        db.execute("UPDATE jobs SET finished_at = finished_at - ? WHERE id = ?", (8 * DAY, old))
    db.close()

    done = cli("prune", "--older-than", "7d", url=daemon.url)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "pruned 1 job finished more than 7d ago\n",
        "",
    )
    assert [j["id"] for j in daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]] == [new]
    assert not (jobs_dir / str(old)).exists()
    assert (outside / "keep").read_text() == "mine"
    assert count(daemon, f"SELECT COUNT(*) FROM events WHERE job_id = {old}") == 0
    assert count(daemon, f"SELECT COUNT(*) FROM events WHERE job_id = {new}") > 0
    assert (jobs_dir / str(new)).exists()

    assert cli("prune", "--older-than", "0s", url=daemon.url).stdout == (
        "pruned 1 job finished more than 0s ago\n"
    )
    assert daemon.call("GET", "/v1/jobs", params={"all": True}) == {"jobs": []}
    assert count(daemon, "SELECT COUNT(*) FROM events") == 0
    assert list(jobs_dir.iterdir()) == []


def test_prune_leaves_queued_and_running_jobs(daemon: Daemon) -> None:
    running = daemon.submit(["sleep", "30"])
    daemon.wait(running, ("running",))
    assert daemon.call("POST", "/v1/prune", json={"older_than_s": 0}) == {
        "pruned": 0,
        "older_than_s": 0.0,
    }
    assert daemon.job(running)["state"] == "running"
    assert (daemon.state_dir / "jobs" / str(running)).exists()


@pytest.mark.parametrize("given", ["7x", "", "-1d", "d", "1.5"])
def test_prune_refuses_a_bad_duration_in_one_line(daemon: Daemon, given: str) -> None:
    # `=`: argparse would take a value that starts with a dash for an option
    done = cli("prune", f"--older-than={given}", url=daemon.url)
    assert done.returncode == 2
    assert done.stderr.startswith("gpupool: error: invalid duration")
    assert done.stderr.count("\n") == 1


def test_the_api_refuses_a_negative_or_missing_age(daemon: Daemon) -> None:
    for body in ({"older_than_s": -1}, {}, {"older_than_s": "soon"}):
        with pytest.raises(InvalidRequest, match="older_than_s"):
            daemon.call("POST", "/v1/prune", json=body)


def test_parse_duration() -> None:
    assert [parse_duration(t) for t in ("7d", "12h", "30m", "0s", "1.5h", "2w")] == [
        7 * DAY,
        12 * 3600,
        1800,
        0,
        5400,
        14 * DAY,
    ]


def test_prune_is_refused_to_an_ordinary_user() -> None:
    with group_daemon("2xA100-40GB", count=1) as (daemon, (user,)):
        job = daemon.submit(["true"])
        daemon.wait(job)
        done = users.gpupool_as(user, "prune", "--older-than", "0s", url=daemon.url)
        listed = daemon.call("GET", "/v1/jobs", params={"all": 1})["jobs"]
    assert done.returncode == 6, done.stderr
    assert done.stderr == (
        f"gpupool: error: pruning finished jobs is for admins (root and the daemon's "
        f"--admin-group); {user.name} is not one\n"
    )
    assert [j["id"] for j in listed] == [job]


def test_the_route_checks_the_callers_uid(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        finished(agent.store, 1)
        app = create_app(agent)

        def as_uid(uid: int) -> TestClient:
            async def with_peer(scope, receive, send):  # type: ignore[no-untyped-def]
                scope[PEER_UID] = uid
                await app(scope, receive, send)

            return TestClient(with_peer, base_url="http://localhost")

        refused = as_uid(4242).post("/v1/prune", json={"older_than_s": 0})
        assert refused.status_code == 403
        assert refused.json()["error"] == "PermissionDenied"
        assert len(agent.store.jobs()) == 1
        assert as_uid(0).post("/v1/prune", json={"older_than_s": 0}).json()["pruned"] == 1
        agent.store.close()


def finished(store: Store, n: int, ago: float = 0.0) -> list[int]:
    """`n` jobs that succeeded `ago` seconds ago, each with its directory."""
    ids = []
    for _ in range(n):
        job = store.add(JobSpec(("true",)), 0, "root")
        store.finish(job.id, State.SUCCEEDED, 0, finished_at=time.time() - ago)
        ids.append(job.id)
    return ids


def test_the_loop_prunes_after_keep_finished(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        config = AgentConfig(tmp_path / "state", keep_finished_s=DAY)
        agent = Agent(config, backend)
        old = finished(agent.store, 3, ago=2 * DAY)
        new = finished(agent.store, 2, ago=60)
        for job_id in old + new:
            (agent.jobs_dir / str(job_id)).mkdir()
        agent.start()
        try:
            left = until(lambda: [job.id for job in agent.store.jobs()] == new, timeout=10)
        finally:
            agent.stop()
    assert left
    assert sorted(int(p.name) for p in agent.jobs_dir.iterdir()) == new


def test_node_events_are_capped_at_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO node_events (at, kind, detail) VALUES (?, 'no_job', ?)",
            [(float(i), str(i)) for i in range(MAX_NODE_EVENTS + 50)],
        )
    assert store.trim_node_events() == 50
    assert store.trim_node_events() == 0
    kept = store.node_events((), limit=MAX_NODE_EVENTS + 50)
    assert len(kept) == MAX_NODE_EVENTS
    assert kept[0]["detail"] == "50"


def test_a_jobs_events_are_capped_at_the_newest(tmp_path: Path) -> None:
    """A replica parked and woken for months keeps its newest events, not all of them."""
    store = Store(tmp_path / "state.db")
    long_lived, short = (store.add(JobSpec(("true",)), 0, "root").id for _ in range(2))
    for i in range(MAX_JOB_EVENTS + 30):
        store.note(long_lived, "resumed", str(i))
    store.note(short, "started")
    assert store.trim_job_events() == 30 + 1  # and its "submitted"
    assert store.trim_job_events() == 0
    kept = store.events(long_lived)
    assert len(kept) == MAX_JOB_EVENTS
    assert (kept[0]["detail"], kept[-1]["detail"]) == ("30", str(MAX_JOB_EVENTS + 29))
    assert [e["kind"] for e in store.events(short)] == ["submitted", "started"]


def test_the_loop_trims_a_long_lived_jobs_events(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        [job_id] = finished(agent.store, 1)
        for i in range(MAX_JOB_EVENTS + 10):
            agent.store.note(job_id, "resumed", str(i))
        agent.start()
        try:
            trimmed = until(lambda: len(agent.store.events(job_id)) == MAX_JOB_EVENTS, timeout=10)
        finally:
            agent.stop()
    assert trimmed


def test_a_prune_finds_old_jobs_through_the_finished_at_index(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(";".join(MIGRATIONS[:-1]) + f";PRAGMA user_version = {len(MIGRATIONS) - 1};")
    db.close()
    store = Store(path)  # the last migration adds the index
    with store.transaction() as db:
        plan = db.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE finished_at < ?", (1.0,)
        ).fetchall()
    assert "jobs_finished" in " ".join(str(row[-1]) for row in plan)
    store.close()
