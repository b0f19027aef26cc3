"""The store's elastic-memory rows: which running jobs are suspended, or asked to be, or waiting
to resume; and a running job's resized share. One transaction each, an event with it."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from gpupool.agent.jobs import JobSpec
from gpupool.agent.store import Store

#: asked to suspend (released once every process of the job has moved its memory to the host)
SUSPEND = "suspend"
#: suspended, asked to resume: waits until its GPUs have room again
RESUME = "resume"
#: told to resume: holds its memory again, until every process has brought it back
RUN = "run"


@dataclass(frozen=True)
class ElasticRow:
    """A job's elastic state. `released`: its device memory is free for admission."""

    job_id: int
    want: str
    released: bool
    #: suspended by preemption: asks to resume by itself once suspended
    then_resume: bool
    reason: str
    since: float

    @property
    def frees_memory(self) -> bool:
        """Admission counts the job's memory free: suspended, or waiting to resume."""
        return self.want == RESUME or (self.want == SUSPEND and self.released)


def rows(store: Store) -> dict[int, ElasticRow]:
    """Every job's row, by job id."""
    with store.transaction() as db:
        found = db.execute(
            "SELECT job_id, want, released, then_resume, reason, since FROM elastic"
        ).fetchall()
    return {
        int(r[0]): ElasticRow(int(r[0]), str(r[1]), bool(r[2]), bool(r[3]), str(r[4]), float(r[5]))
        for r in found
    }


def _event(db: sqlite3.Connection, job_id: int, kind: str, detail: str) -> None:
    db.execute(
        "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
        (job_id, time.time(), kind, detail),
    )


def put(
    store: Store,
    job_id: int,
    want: str,
    event: tuple[str, str] | None = None,
    *,
    released: bool = False,
    then_resume: bool = False,
    reason: str = "",
) -> None:
    """Set `job_id`'s row (and write `event`, kind and detail, with it)."""
    with store.transaction() as db:
        db.execute(
            "INSERT OR REPLACE INTO elastic (job_id, want, released, then_resume, reason, since) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, want, int(released), int(then_resume), reason, time.time()),
        )
        if event is not None:
            _event(db, job_id, *event)


def forget(store: Store, job_id: int, event: tuple[str, str] | None = None) -> None:
    """The job runs as launched again (or ended): no row."""
    with store.transaction() as db:
        db.execute("DELETE FROM elastic WHERE job_id = ?", (job_id,))
        if event is not None:
            _event(db, job_id, *event)


def resize(store: Store, job_id: int, spec: JobSpec, memory: tuple[int, ...], detail: str) -> None:
    """A running job's share is now `spec` (its memory and compute), `memory` bytes per GPU."""
    with store.transaction() as db:
        db.execute(
            "UPDATE jobs SET spec = ?, memory = ? WHERE id = ?",
            (json.dumps(spec.to_json()), json.dumps(list(memory)), job_id),
        )
        _event(db, job_id, "resized", detail)
