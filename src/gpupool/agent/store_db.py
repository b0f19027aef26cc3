"""The state database's connection: opened private, checked and migrated; one lock, one
transaction per change.

A corrupt store is refused at open (`PRAGMA quick_check`). Another process holding the
database's write lock (a backup, an admin's sqlite3) makes a change fail within about a second
with `StoreBusy`, never block the daemon for long: the API answers 503 and the queue loop
retries.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpupool.agent.store_schema import MIGRATIONS, SCHEMA_VERSION
from gpupool.core.errors import ConfigError, DaemonError, StoreBusy, StoreFull

#: how long one statement waits for another process's lock on the database, and a caller for
#: another thread's use of the connection: an API request answers within about a second
BUSY_TIMEOUT_S = 0.5
LOCK_TIMEOUT_S = 1.0

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


#: bytes the WAL is cut back to after a checkpoint (SQLite checkpoints at 1,000 pages: 4 MiB)
WAL_LIMIT = 4 * 1024 * 1024


class Database:
    """The connection; safe to share between threads (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        _private_files(path)
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL with NORMAL: a killed process loses nothing (the WAL is in the OS already);
            # only a power cut may lose the last transactions
            self._db.execute("PRAGMA synchronous=NORMAL")
            # SQLite reuses the WAL after a checkpoint but never shrinks it: one burst (a flood
            # of submits while a listing reads) would hold its size for the daemon's life
            self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
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
        errors as one line: StoreBusy for a lock held elsewhere, StoreFull for a full disk,
        else DaemonError."""
        if not self._lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise StoreBusy("the daemon's state is busy: try again in a moment")
        try:
            yield self._db
        except sqlite3.Error as err:  # a full disk, a read-only file, a lock: one line
            name = getattr(err, "sqlite_errorname", "")
            if name == "SQLITE_FULL":
                raise StoreFull(
                    f"the daemon cannot {doing} its state: the disk under it is full ({err}): "
                    "nothing was changed; try again once there is space"
                ) from err
            if name in ("SQLITE_BUSY", "SQLITE_LOCKED"):
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
