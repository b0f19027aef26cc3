"""The daemon's state in SQLite (WAL): jobs and their events; every state change one transaction.

The schema version is SQLite's `user_version`; `MIGRATIONS[i]` takes a store from version i to
i + 1, so an older store is brought forward at open and a newer one is refused. A corrupt store
is refused at open (`PRAGMA quick_check`). Another process holding the database's write lock (a
backup, an admin's sqlite3) makes a change fail within about a second with `StoreBusy`, never
block the daemon for long: the API answers 503 and the queue loop retries.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Container, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.agent.jobs import PRIORITY_RANK, UNREADABLE_SPEC, Job, JobSpec, MigUse, State
from gpupool.core.errors import ConfigError, DaemonError, GpupoolError, NotFound, StoreBusy

#: how long one statement waits for another process's lock on the database, and a caller for
#: another thread's use of the connection: an API request answers within about a second
BUSY_TIMEOUT_S = 0.5
LOCK_TIMEOUT_S = 1.0
#: the node events (the watchdog's) kept: the newest ones
MAX_NODE_EVENTS = 10_000

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        spec TEXT NOT NULL,
        uid INTEGER NOT NULL,
        user TEXT NOT NULL,
        state TEXT NOT NULL,
        rank INTEGER NOT NULL,
        submitted_at REAL NOT NULL,
        gpus TEXT NOT NULL DEFAULT '[]',
        memory TEXT NOT NULL DEFAULT '[]',
        started_at REAL,
        finished_at REAL,
        exit_code INTEGER,
        oom INTEGER NOT NULL DEFAULT 0,
        peak_memory INTEGER,
        supervisor_pid INTEGER,
        supervisor_start INTEGER,
        job_pid INTEGER,
        cancel_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_state ON jobs (state, rank, id);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX events_job ON events (job_id, id);
    CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # the watchdog: events of the node (a GPU process of no job), and job events by kind
    """
    CREATE TABLE node_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        pid INTEGER,
        gpu INTEGER,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX node_events_at ON node_events (at);
    CREATE INDEX events_kind ON events (kind, at);
    """,
    # the MIG instance of each MIG job: written before the daemon creates one (uuid NULL until
    # it exists), so a daemon killed in between finds it at restart and no instance is orphaned;
    # `released` once the job is done with it (destroyed, or left for the next job)
    """
    CREATE TABLE mig_instances (
        job_id INTEGER PRIMARY KEY REFERENCES jobs (id),
        gpu INTEGER NOT NULL,
        profile TEXT NOT NULL,
        start INTEGER NOT NULL,
        gi_id INTEGER,
        uuid TEXT,
        memory INTEGER NOT NULL DEFAULT 0,
        created INTEGER NOT NULL,
        released INTEGER NOT NULL DEFAULT 0
    );
    """,
    # pruning finished jobs by age
    """
    CREATE INDEX jobs_finished ON jobs (finished_at);
    """,
    # elastic memory: a running job asked to suspend, suspended, or waiting to resume
    # (agent/elastic_store.py); no row: it runs as launched
    """
    CREATE TABLE elastic (
        job_id INTEGER PRIMARY KEY REFERENCES jobs (id),
        want TEXT NOT NULL,
        released INTEGER NOT NULL DEFAULT 0,
        then_resume INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '',
        since REAL NOT NULL
    );
    """,
    # services (agent/service_store.py): each one's spec and owner, and its replicas' jobs
    """
    CREATE TABLE services (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        uid INTEGER NOT NULL,
        user TEXT NOT NULL,
        generation INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL
    );
    CREATE TABLE replicas (
        job_id INTEGER PRIMARY KEY REFERENCES jobs (id),
        service TEXT NOT NULL,
        idx INTEGER NOT NULL,
        port INTEGER NOT NULL,
        generation INTEGER NOT NULL
    );
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

_OPEN_STATES = (State.QUEUED.value, State.RUNNING.value)
#: ids in one `IN (...)`: well under SQLite's limit on a statement's parameters
_IDS_PER_QUERY = 500
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


#: SQLite's companions of a WAL database, which it creates with the database's mode and owner
_COMPANIONS = ("-wal", "-shm")


def _private_files(path: Path) -> None:
    """Make the database 0600 before SQLite opens it (so its WAL and shared memory are, too),
    never through a link; one left 0644 by an older gpupool, and its companions, become 0600."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = -1
    except OSError as err:
        raise ConfigError(f"cannot create the state database {path}: {err.strerror}") from err
    if fd >= 0:
        os.close(fd)
        return
    for name in [path, *(Path(f"{path}{suffix}") for suffix in _COMPANIONS)]:
        try:
            fd = os.open(name, flags)
        except FileNotFoundError:
            continue
        except OSError as err:  # ELOOP: a symbolic link
            raise ConfigError(
                f"cannot open the state database {name}: {err.strerror} "
                "(it must be a plain file of the daemon's user)"
            ) from err
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
                raise ConfigError(
                    f"{name} is not a plain file of the daemon's user: remove it, or give "
                    "another state dir"
                )
            if stat.S_IMODE(found.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


class Store:
    """Jobs and events; safe to share between threads (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        _private_files(path)
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL with NORMAL: a killed process loses nothing (the WAL is in the OS already);
            # only a power cut may lose the last transactions
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            self._check(path)
            self._migrate(path)
        except sqlite3.Error as err:
            raise ConfigError(f"cannot open the state database {path}: {err}") from err
        self._lock = threading.RLock()

    def _check(self, path: Path) -> None:
        """ConfigError, with what to do, for a corrupt database: a daemon that went on would
        fail on the first bad page it reads, and a restart would fail the same way again."""
        try:
            found = [str(row[0]) for row in self._db.execute("PRAGMA quick_check(3)")]
        except sqlite3.DatabaseError as err:
            if err.sqlite_errorname not in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
                raise
            found = [str(err)]
        if found != ["ok"]:
            said = " ".join("; ".join(found).replace("*** in database main ***", "").split())
            raise ConfigError(
                f"the state database {path} is corrupt (quick_check: {said}): move it aside "
                "with its -wal and -shm files and the jobs directory beside it (new jobs reuse "
                "their numbers) and start again; the jobs it knew are lost"
            )

    def _migrate(self, path: Path) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"the state database {path} has schema {version}, newer than this gpupool "
                f"({SCHEMA_VERSION}): upgrade gpupool"
            )
        for step in range(version, SCHEMA_VERSION):
            self._db.execute("BEGIN IMMEDIATE")
            for statement in MIGRATIONS[step].split(";"):
                if statement.strip():
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {step + 1}")
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _using(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection for this thread alone, within LOCK_TIMEOUT_S (else StoreBusy); its
        errors as one line: StoreBusy for a lock held elsewhere, else DaemonError."""
        if not self._lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise StoreBusy("the daemon's state is busy: try again in a moment")
        try:
            yield self._db
        except sqlite3.Error as err:  # a full disk, a read-only file, a lock: one line
            if getattr(err, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                raise StoreBusy(
                    f"the daemon's state database is locked by another process ({err}): try "
                    "again in a moment"
                ) from err
            raise DaemonError(f"the daemon cannot {doing} its state: {err}") from err
        finally:
            self._lock.release()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction: all of it or nothing."""
        with self._using("write") as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    # -- reads ------------------------------------------------------------------------------

    def job(self, job_id: int) -> Job:
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
            query += f" WHERE state IN ({','.join('?' * len(states))})"
            args = tuple(s.value for s in states)
        with self._using("read") as db:
            rows = db.execute(query + " ORDER BY rank, id", args).fetchall()
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
            rows = []
            for at in range(0, len(wanted), _IDS_PER_QUERY):
                chunk = wanted[at : at + _IDS_PER_QUERY]
                marks = ",".join("?" * len(chunk))
                rows += db.execute(
                    f"SELECT {_COLUMNS} FROM jobs WHERE id IN ({marks})", chunk
                ).fetchall()
        return ids, {job.id: job for job in map(_job, rows)}

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

    def job_ids(self) -> set[int]:
        """The id of every job the store holds."""
        with self._using("read") as db:
            return {int(row[0]) for row in db.execute("SELECT id FROM jobs")}

    def setting(self, key: str) -> str | None:
        with self._using("read") as db:
            row = db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row["value"])

    # -- changes (each one transaction) -----------------------------------------------------

    def set_setting(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, value))

    def add(self, spec: JobSpec, uid: int, user: str) -> Job:
        now = time.time()
        with self.transaction() as db:
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
            _event(db, job_id, "submitted", f"by {user} (uid {uid})", now)
        return Job(job_id, spec, uid, user, State.QUEUED, now)

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
                _event(db, job.id, "placed", detail, now)
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
            _event(db, job_id, "started", f"pid {job_pid}")

    def requeue(self, job_id: int, why: str) -> None:
        """running -> queued for a launch that never began (the daemon died before it)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = ?, gpus = '[]', memory = '[]', started_at = NULL "
                "WHERE id = ? AND state = ?",
                (State.QUEUED.value, job_id, State.RUNNING.value),
            )
            _event(db, job_id, "requeued", why)

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
                    _event(db, job_id, "oom", "the shim refused an allocation past the share")
                _event(db, job_id, state.value, detail, finished_at)
        return bool(updated)

    def request_cancel(self, job_id: int, by: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
            _event(db, job_id, "cancel", f"asked by {by}")

    def note(self, job_id: int, kind: str, detail: str = "") -> None:
        with self.transaction() as db:
            _event(db, job_id, kind, detail)

    def node_event(self, kind: str, pid: int | None, gpu: int | None, detail: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO node_events (at, kind, pid, gpu, detail) VALUES (?, ?, ?, ?, ?)",
                (time.time(), kind, pid, gpu, detail),
            )

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

    def trim_node_events(self, keep: int = MAX_NODE_EVENTS) -> int:
        """Delete all but the newest `keep` node events; how many went."""
        with self.transaction() as db:
            return db.execute(
                "DELETE FROM node_events WHERE id <= "
                "(SELECT id FROM node_events ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (keep,),
            ).rowcount

    def record_peak(self, peaks: dict[int, int]) -> None:
        with self.transaction() as db:
            for job_id, peak in peaks.items():
                db.execute(
                    "UPDATE jobs SET peak_memory = MAX(COALESCE(peak_memory, 0), ?) WHERE id = ?",
                    (peak, job_id),
                )

    # -- MIG instances of MIG jobs --------------------------------------------------------------

    def mig_intend(self, job_id: int, gpu: int, profile: str, start: int) -> None:
        """Note, before creating it, the instance the daemon is about to create for a job."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO mig_instances (job_id, gpu, profile, start, created) "
                "VALUES (?, ?, ?, ?, 1)",
                (job_id, gpu, profile, start),
            )

    def mig_assign(self, job_id: int, use: MigUse) -> None:
        """The job's instance, existing (created or found free)."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO mig_instances "
                "(job_id, gpu, profile, start, gi_id, uuid, memory, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    use.gpu,
                    use.profile,
                    use.start,
                    use.gi_id,
                    use.uuid,
                    use.memory_total,
                    int(use.created),
                ),
            )

    def mig_rows(
        self, *, released: bool = False
    ) -> list[tuple[int, MigUse | None, tuple[int, str, int]]]:
        """The instances jobs hold (with `released`, also those they held): job id, its
        instance (None while only intended), (gpu, profile, start)."""
        with self._using("read") as db:
            rows = db.execute(
                "SELECT job_id, gpu, profile, start, gi_id, uuid, memory, created "
                "FROM mig_instances WHERE released = 0 OR ? ORDER BY job_id",
                (int(released),),
            ).fetchall()
        found = []
        for r in rows:
            use = None
            if r["uuid"] is not None:
                use = MigUse(
                    r["gpu"],
                    r["gi_id"],
                    r["profile"],
                    r["start"],
                    r["uuid"],
                    r["memory"],
                    bool(r["created"]),
                )
            found.append((r["job_id"], use, (r["gpu"], r["profile"], r["start"])))
        return found

    def mig_uses(self, *, released: bool = False) -> dict[int, MigUse]:
        """The instance of each job that holds one (with `released`: or held one)."""
        rows = self.mig_rows(released=released)
        return {job_id: use for job_id, use, _ in rows if use is not None}

    def mig_release(self, job_id: int) -> None:
        """The job is done with its instance; the row stays, so `ps -a` still names it."""
        with self.transaction() as db:
            db.execute("UPDATE mig_instances SET released = 1 WHERE job_id = ?", (job_id,))

    def mig_forget(self, job_id: int) -> None:
        """An intended instance that was never made for the job."""
        with self.transaction() as db:
            db.execute("DELETE FROM mig_instances WHERE job_id = ?", (job_id,))


def _event(
    db: sqlite3.Connection, job_id: int, kind: str, detail: str, at: float | None = None
) -> None:
    db.execute(
        "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
        (job_id, time.time() if at is None else at, kind, detail),
    )
