"""The state database's schema: the migrations that bring a store from each version to the next.

The schema version is SQLite's `user_version`; `MIGRATIONS[i]` takes a store from version i to
i + 1 (store_db.py runs them at open), so an older store is brought forward and a newer one is
refused.
"""

from __future__ import annotations

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
