"""The store's event tables: each job's events, and the node's (the watchdog's)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from gpupool.agent.store_db import Database

#: the node events (the watchdog's) kept: the newest ones
MAX_NODE_EVENTS = 10_000
#: the events kept of one job: the newest ones. A job that runs for months (a service's replica,
#: parked and woken thousands of times) would otherwise grow the store with every cycle
MAX_JOB_EVENTS = 200


class EventLog(Database):
    """The jobs' and the node's events (tables `events`, `node_events`)."""

    def events(self, job_id: int) -> list[dict[str, Any]]:
        with self._using("read") as db:
            rows = db.execute(
                "SELECT at, kind, detail FROM events WHERE job_id = ? ORDER BY id", (job_id,)
            ).fetchall()
        return [{"at": r["at"], "kind": r["kind"], "detail": r["detail"]} for r in rows]

    def job_ids_with(self, kind: str) -> set[int]:
        """The jobs that have at least one event of `kind`."""
        with self._using("read") as db:
            rows = db.execute(
                "SELECT DISTINCT job_id FROM events WHERE kind = ?", (kind,)
            ).fetchall()
        return {int(row["job_id"]) for row in rows}

    def node_events(
        self, job_kinds: Sequence[str], since: float = 0.0, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The node's events and the jobs' events of `job_kinds` since `since`, the newest
        `limit` of them, oldest first."""
        marks = ",".join("?" * len(job_kinds)) or "NULL"
        query = (
            "SELECT at, kind, NULL AS job_id, pid, gpu, detail FROM node_events WHERE at >= ? "
            "UNION ALL SELECT at, kind, job_id, NULL, NULL, detail FROM events "
            f"WHERE kind IN ({marks}) AND at >= ? ORDER BY at DESC LIMIT ?"
        )
        with self._using("read") as db:
            rows = db.execute(query, (since, *job_kinds, since, limit)).fetchall()
        return [dict(row) for row in reversed(rows)]

    def recent_events(self, limit: int = 50) -> list[dict[str, Any]]:
        """The last `limit` events of all jobs, newest first."""
        with self._using("read") as db:
            rows = db.execute(
                "SELECT at, job_id, kind, detail FROM events ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
        return [
            {"at": r["at"], "job_id": r["job_id"], "kind": r["kind"], "detail": r["detail"]}
            for r in rows
        ]

    def note(self, job_id: int, kind: str, detail: str = "") -> None:
        with self.transaction() as db:
            add_event(db, job_id, kind, detail)

    def node_event(self, kind: str, pid: int | None, gpu: int | None, detail: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO node_events (at, kind, pid, gpu, detail) VALUES (?, ?, ?, ?, ?)",
                (time.time(), kind, pid, gpu, detail),
            )

    def trim_node_events(self, keep: int = MAX_NODE_EVENTS) -> int:
        """Delete all but the newest `keep` node events; how many went."""
        with self.transaction() as db:
            return db.execute(
                "DELETE FROM node_events WHERE id <= "
                "(SELECT id FROM node_events ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (keep,),
            ).rowcount

    def trim_job_events(self, keep: int = MAX_JOB_EVENTS) -> int:
        """Delete all but the newest `keep` events of each job; how many went."""
        with self.transaction() as db:
            long_lived = db.execute(
                "SELECT job_id FROM events GROUP BY job_id HAVING count(*) > ?", (keep,)
            ).fetchall()
            return sum(
                db.execute(
                    "DELETE FROM events WHERE job_id = ? AND id <= (SELECT id FROM events "
                    "WHERE job_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (row["job_id"], row["job_id"], keep),
                ).rowcount
                for row in long_lived
            )


def add_event(
    db: sqlite3.Connection, job_id: int, kind: str, detail: str, at: float | None = None
) -> None:
    """Append a job's event within the caller's transaction."""
    db.execute(
        "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
        (job_id, time.time() if at is None else at, kind, detail),
    )
