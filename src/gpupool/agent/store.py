"""The daemon's state in SQLite (WAL): jobs and their events; every state change one transaction.

`Store` is the whole of it: the connection (store_db.py, migrated by store_schema.py), the jobs
table here, the events (store_events.py) and the MIG instances (store_mig.py); the elastic rows
and the services' have their own modules over it (elastic_store.py, service_store.py).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import replace

from gpupool.agent.jobs import PRIORITY_RANK, UNREADABLE_SPEC, Job, JobSpec, State
from gpupool.agent.store_events import EventLog, add_event
from gpupool.agent.store_mig import MigInstances
from gpupool.core.errors import GpupoolError, NotFound

_OPEN_STATES = (State.QUEUED.value, State.RUNNING.value)
#: ids in one `IN (...)`: well under SQLite's limit on a statement's parameters
_IDS_PER_QUERY = 500
#: SQLite's integers are 64-bit signed: an id past this names no job (and cannot be bound)
MAX_JOB_ID = 2**63 - 1
_COLUMNS = (
    "id, spec, uid, user, state, submitted_at, gpus, memory, started_at, finished_at, exit_code, "
    "oom, peak_memory, supervisor_pid, supervisor_start, job_pid, cancel_requested"
)


@functools.lru_cache(maxsize=1024)  # more than the live jobs of any node
def _spec(text: str) -> JobSpec | str:
    """A stored spec, parsed and checked once: a spec never changes after its submission, and
    the daemon reads its live jobs several times a second (the queue loop, each /metrics
    scrape). Callers share the frozen JobSpec; its env they copy before changing anything.
    A spec that no longer passes (stored by an older, laxer gpupool) is the one line why, so
    that one bad row cannot make every listing fail."""
    try:
        return JobSpec.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError, GpupoolError) as err:
        return f"its stored spec cannot be read ({type(err).__name__}: {err})"


def _marks(count: int) -> str:
    """The placeholders of an IN (...) list of `count` values."""
    return ",".join("?" * count)


def _rows_by_id(
    db: sqlite3.Connection, ids: Sequence[int], states: Sequence[State] = ()
) -> list[sqlite3.Row]:
    """The rows (and rank) of the jobs `ids`, only those in `states` if any are given, read
    _IDS_PER_QUERY ids at a time."""
    where = f"state IN ({_marks(len(states))}) AND " if states else ""
    rows: list[sqlite3.Row] = []
    for at in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[at : at + _IDS_PER_QUERY]
        rows += db.execute(
            f"SELECT {_COLUMNS}, rank FROM jobs WHERE {where}id IN ({_marks(len(chunk))})",
            (*(state.value for state in states), *chunk),
        ).fetchall()
    return rows


def _put_setting(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, value))


def _job(row: sqlite3.Row) -> Job:
    spec = _spec(row["spec"])
    return Job(
        id=row["id"],
        spec=UNREADABLE_SPEC if isinstance(spec, str) else spec,
        unreadable=spec if isinstance(spec, str) else None,
        uid=row["uid"],
        user=row["user"],
        state=State(row["state"]),
        submitted_at=row["submitted_at"],
        gpus=tuple(json.loads(row["gpus"])),
        memory=tuple(json.loads(row["memory"])),
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        exit_code=row["exit_code"],
        oom=bool(row["oom"]),
        peak_memory=row["peak_memory"],
        supervisor_pid=row["supervisor_pid"],
        supervisor_start=row["supervisor_start"],
        job_pid=row["job_pid"],
        cancel_requested=bool(row["cancel_requested"]),
    )


class Store(EventLog, MigInstances):
    """Jobs, their events, the node's events, MIG instances and settings; safe to share between
    threads (one connection behind a lock)."""

    # -- reads ------------------------------------------------------------------------------

    def job(self, job_id: int) -> Job:
        row = None
        if 0 < job_id <= MAX_JOB_ID:
            with self._using("read") as db:
                row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id}")
        return _job(row)

    def jobs(self, states: Sequence[State] | None = None) -> list[Job]:
        """Jobs in queue order (priority, then submission) among `states` (all when None)."""
        query = f"SELECT {_COLUMNS} FROM jobs"
        args: tuple[str, ...] = ()
        if states is not None:
            query += f" WHERE state IN ({_marks(len(states))})"
            args = tuple(s.value for s in states)
        with self._using("read") as db:
            rows = db.execute(query + " ORDER BY rank, id", args).fetchall()
        return [_job(row) for row in rows]

    def has_jobs(self, states: Sequence[State]) -> bool:
        """Whether any job is in `states` (one row of the state index read)."""
        query = f"SELECT 1 FROM jobs WHERE state IN ({_marks(len(states))}) LIMIT 1"
        with self._using("read") as db:
            found = db.execute(query, [s.value for s in states]).fetchone()
        return found is not None

    def jobs_among(self, ids: Collection[int], states: Sequence[State]) -> list[Job]:
        """The jobs of `ids` that are in `states`, in queue order: a few jobs' rows, where
        `jobs(states)` would read (and parse) every job in those states."""
        with self._using("read") as db:
            rows = _rows_by_id(db, sorted(ids), states)
        rows.sort(key=lambda row: (row["rank"], row["id"]))
        return [_job(row) for row in rows]

    def listing(self, known: Container[int]) -> tuple[list[tuple[int, bool]], dict[int, Job]]:
        """Every job's id and whether it has finished, by id; and, read at the same moment,
        the jobs that have not finished or are not in `known` (whose listing the caller
        keeps: a finished job never changes)."""
        with self._using("read") as db:
            cursor = db.cursor()
            cursor.row_factory = None  # plain tuples: 10,000 rows of sqlite3.Row cost 20 ms
            ids: list[tuple[int, bool]] = cursor.execute(
                "SELECT id, state NOT IN (?, ?) FROM jobs ORDER BY id", _OPEN_STATES
            ).fetchall()
            wanted = [job_id for job_id, finished in ids if not finished or job_id not in known]
            rows = _rows_by_id(db, wanted)
        return ids, {job.id: job for job in map(_job, rows)}

    def job_ids(self) -> set[int]:
        """The id of every job the store holds."""
        with self._using("read") as db:
            return {int(row[0]) for row in db.execute("SELECT id FROM jobs")}

    def last_job_id(self) -> int:
        """The highest id the store ever assigned to a job (pruned ones included); 0 if none."""
        with self._using("read") as db:
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        return 0 if row is None else int(row[0])

    def setting(self, key: str) -> str | None:
        with self._using("read") as db:
            row = db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row["value"])

    # -- changes (each one transaction) -----------------------------------------------------

    def set_setting(self, key: str, value: str) -> None:
        with self.transaction() as db:
            _put_setting(db, key, value)

    def add(
        self, spec: JobSpec, uid: int, user: str, settings: Mapping[str, str] | None = None
    ) -> Job:
        """A queued job; `settings` are written in the same transaction."""
        return self.add_many([(spec, uid, user)], settings)[0]

    def add_many(
        self, submits: Sequence[tuple[JobSpec, int, str]], settings: Mapping[str, str] | None = None
    ) -> list[Job]:
        """Queued jobs of (spec, uid, user), in order, and `settings`: one transaction."""
        now = time.time()
        added = []
        with self.transaction() as db:
            for key, value in (settings or {}).items():
                _put_setting(db, key, value)
            for spec, uid, user in submits:
                cursor = db.execute(
                    "INSERT INTO jobs (spec, uid, user, state, rank, submitted_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        json.dumps(spec.to_json()),
                        uid,
                        user,
                        State.QUEUED.value,
                        PRIORITY_RANK[spec.priority],
                        now,
                    ),
                )
                job_id = int(cursor.lastrowid or 0)
                add_event(db, job_id, "submitted", f"by {user} (uid {uid})", now)
                added.append(Job(job_id, spec, uid, user, State.QUEUED, now))
        return added

    def start(self, job: Job, gpus: Sequence[int], memory: Sequence[int], detail: str) -> Job:
        """queued -> running on `gpus` (the launch follows; recovery finishes a cut one)."""
        now = time.time()
        with self.transaction() as db:
            updated = db.execute(
                "UPDATE jobs SET state = ?, gpus = ?, memory = ?, started_at = ? "
                "WHERE id = ? AND state = ?",
                (
                    State.RUNNING.value,
                    json.dumps(list(gpus)),
                    json.dumps(list(memory)),
                    now,
                    job.id,
                    State.QUEUED.value,
                ),
            ).rowcount
            if updated:
                add_event(db, job.id, "placed", detail, now)
        return replace(
            job, state=State.RUNNING, gpus=tuple(gpus), memory=tuple(memory), started_at=now
        )

    def launched(self, job_id: int, supervisor: tuple[int, int], job_pid: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET supervisor_pid = ?, supervisor_start = ?, job_pid = ? "
                "WHERE id = ?",
                (supervisor[0], supervisor[1], job_pid, job_id),
            )
            add_event(db, job_id, "started", f"pid {job_pid}")

    def requeue(self, job_id: int, why: str) -> None:
        """running -> queued for a launch that never began (the daemon died before it)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = ?, gpus = '[]', memory = '[]', started_at = NULL "
                "WHERE id = ? AND state = ?",
                (State.QUEUED.value, job_id, State.RUNNING.value),
            )
            add_event(db, job_id, "requeued", why)

    def finish(
        self,
        job_id: int,
        state: State,
        exit_code: int | None,
        *,
        finished_at: float,
        oom: bool = False,
        peak_memory: int | None = None,
        detail: str = "",
    ) -> bool:
        """queued/running -> a final state; False (nothing changed) when already final."""
        with self.transaction() as db:
            updated = db.execute(
                "UPDATE jobs SET state = ?, exit_code = ?, finished_at = ?, oom = ?, "
                "peak_memory = COALESCE(?, peak_memory) WHERE id = ? AND state IN (?, ?)",
                (
                    state.value,
                    exit_code,
                    finished_at,
                    int(oom),
                    peak_memory,
                    job_id,
                    State.QUEUED.value,
                    State.RUNNING.value,
                ),
            ).rowcount
            if updated:
                if oom:
                    add_event(db, job_id, "oom", "the shim refused an allocation past the share")
                add_event(db, job_id, state.value, detail, finished_at)
        return bool(updated)

    def request_cancel(self, job_id: int, by: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
            add_event(db, job_id, "cancel", f"asked by {by}")

    def prune(self, finished_before: float) -> list[int]:
        """Delete the jobs that finished before `finished_before` (Unix time), with their
        events and MIG rows; their ids. A job still holding a MIG instance stays."""
        kept = (
            "finished_at < ? AND state NOT IN (?, ?) "
            "AND id NOT IN (SELECT job_id FROM mig_instances WHERE released = 0)"
        )
        args = (finished_before, State.QUEUED.value, State.RUNNING.value)
        with self.transaction() as db:
            ids = [int(row[0]) for row in db.execute(f"SELECT id FROM jobs WHERE {kept}", args)]
            if ids:
                for table, column in (
                    ("events", "job_id"),
                    ("mig_instances", "job_id"),
                    ("elastic", "job_id"),
                ):
                    db.execute(
                        f"DELETE FROM {table} WHERE {column} IN (SELECT id FROM jobs WHERE {kept})",
                        args,
                    )
                db.execute(f"DELETE FROM jobs WHERE {kept}", args)
        return ids

    def record_peak(self, peaks: dict[int, int]) -> None:
        with self.transaction() as db:
            for job_id, peak in peaks.items():
                db.execute(
                    "UPDATE jobs SET peak_memory = MAX(COALESCE(peak_memory, 0), ?) WHERE id = ?",
                    (peak, job_id),
                )
