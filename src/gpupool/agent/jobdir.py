"""A job's directory under the state dir: launch file, claim, pids, exit status, output logs.

Layout (the supervisor's side is `agent/supervisor.py`):

    jobs/            0711 daemon's user   searchable, not listable
      N/             0711 daemon's user   the job's user reaches its share directory through it
        launch.json  0600 daemon's user   the whole environment: for the supervisor only
        claim, pids.json, exit.json       0600 daemon's user
        stdout, stderr                    0600 the job's user (created by the supervisor, which
                                          alone writes them, from the job's pipes)
        gpupool-share-XXXXXXXX/  0700 the job's user: its accounting region, created by its
                                          processes (the interception library)

The job's user may create files only in its share directory, which the daemon reads through
`isolation/region.py` (non-blocking, no link followed, a regular file of the directory's owner
or nothing). It cannot rename, replace or add anything in N/ itself, so the daemon's files
there are what the daemon wrote, and the logs are the files the supervisor made. A fresh share
directory per launch (a random name, made with mkdir's O_EXCL semantics) means a descriptor
kept open by path reads that launch's region.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.agent import statedir, supervisor
from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.devices.procfs import process_start_time
from gpupool.isolation.launch import SHARE_DIR_PREFIX

DEFAULT_MAX_LOG_SIZE = supervisor.DEFAULT_MAX_LOG_SIZE
#: the smallest cap: room for the line that says what was dropped, and more
MIN_LOG_SIZE = 4096
JOBS_DIR = "jobs"
#: searchable, not listable: a job's user reaches its own share directory by its path
DIR_MODE = 0o711
FILE_MODE = supervisor.FILE_MODE
STREAMS = ("stdout", "stderr")
#: the most read of the daemon's own small files (pids, exit status, claim)
_SMALL_FILE = 64 * 1024
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_reported: set[Path] = set()
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pids:
    supervisor: int
    supervisor_start: int
    job: int
    job_start: int


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int
    at: float
    #: the interception library refused an allocation past the share (its line went by)
    oom: bool = False


def jobs_dir(state_dir: Path) -> Path:
    """The directory of the job directories (made 0711 if missing)."""
    return statedir.private_dir(state_dir, JOBS_DIR, DIR_MODE)


def remove_unknown(
    jobs: Path, known_ids: Callable[[], Container[int]], last_assigned: Callable[[], int]
) -> None:
    """Remove every job directory under `jobs` whose job the store no longer holds (pruned now,
    or by a prune cut short), relative to the jobs dir's fd and without following a link: a
    job's owner writes in its directory and may leave links there. A directory of an id the
    store never assigned (past `last_assigned()`) is no pruned job's: it belongs to another
    database (one restored from an older backup, or replaced), so it is kept and said."""
    fd = os.open(jobs, statedir.DIR_FLAGS)
    try:
        # listed before the ids are read: a job's row is written before its directory, so a
        # directory listed here whose id is not in the store has been pruned
        names = [name for name in os.listdir(fd) if name.isdigit()]
        known, last = known_ids(), last_assigned()
        strangers = sorted(int(name) for name in names if int(name) > last)
        if strangers:
            log.warning("%s", _not_assigned(jobs, strangers, f"the newest it assigned is {last}"))
        for name in names:
            if int(name) not in known and int(name) <= last:
                shutil.rmtree(name, dir_fd=fd, onerror=_removal_failed)
    finally:
        os.close(fd)


def require_known(jobs: Path, last_assigned: int, database: str) -> None:
    """Stop (ConfigError, one line) when `jobs` holds directories of jobs the store never
    assigned (ids past `last_assigned`): the database is missing, empty or older than the jobs
    directory, and a daemon that went on would reuse their ids in those directories."""
    strangers = sorted(int(name) for name in os.listdir(jobs) if name.isdigit())
    strangers = [job_id for job_id in strangers if job_id > last_assigned]
    if strangers:
        raise ConfigError(_not_assigned(jobs, strangers, database))


def _not_assigned(jobs: Path, ids: list[int], database: str) -> str:
    return (
        f"{jobs} holds {len(ids)} job directories (ids {ids[0]} to {ids[-1]}) that the state "
        f"database never assigned ({database}): restore the state.db that goes with them "
        f"(with its -wal and -shm files), or move the directory aside (mv {jobs} {jobs}.old) "
        "to start anew; nothing was deleted"
    )


def _removal_failed(function: Any, path: str, info: Any) -> None:
    """A job directory that cannot be removed in full: told, and tried again at the next prune."""
    error = info[1] if isinstance(info, tuple) else info
    if not isinstance(error, FileNotFoundError):
        log.warning("cannot remove jobs/%s: %s", path, error)


def _open_regular(path: Path) -> int | None:
    """`path` opened for reading without following a link or blocking (a FIFO), if it is a
    regular file; None if it is missing or anything else (said once per path)."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return None
    except OSError as err:
        _skip(path, err.strerror or str(err))
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    _skip(path, "not a regular file")
    return None


def _skip(path: Path, why: str) -> None:
    if path not in _reported:
        _reported.add(path)
        log.warning("skipping %s: %s", path, why)


def _read_small(path: Path) -> bytes | None:
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        return os.read(fd, _SMALL_FILE)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, Any] | None:
    text = _read_small(path)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def alive(pid: int, start: int) -> bool:
    """True when `pid` is the same process that had start time `start` (not a reused pid)."""
    return process_start_time(pid) == start


@dataclass(frozen=True)
class JobDir:
    path: Path
    #: each log's cap in bytes (0: none), written into the launch file for the supervisor
    max_log_size: int = DEFAULT_MAX_LOG_SIZE

    @property
    def launch_file(self) -> Path:
        return self.path / "launch.json"

    @property
    def stdout(self) -> Path:
        return self.path / "stdout"

    @property
    def stderr(self) -> Path:
        return self.path / "stderr"

    def log(self, stream: str) -> Path:
        return self.stderr if stream == "stderr" else self.stdout

    def create(self) -> None:
        """Make the directory (0711, the daemon's) if it is not there yet."""
        statedir.private_dir(self.path.parent, self.path.name, DIR_MODE)

    def write_launch(self, launch: dict[str, Any]) -> None:
        """Write `launch.json` (0600: it holds the job's whole environment) atomically."""
        self.create()
        here = os.open(self.path, statedir.DIR_FLAGS)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("launch.json.tmp", dir_fd=here)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open("launch.json.tmp", flags, FILE_MODE, dir_fd=here)
            with os.fdopen(fd, "w") as out:
                json.dump(launch, out)
            os.replace("launch.json.tmp", "launch.json", src_dir_fd=here, dst_dir_fd=here)
        finally:
            os.close(here)

    def hand_over_shares(self, uid: int, gid: int) -> None:
        """Give the job's share directories to its user, whose processes create the region."""
        here = os.open(self.path, statedir.DIR_FLAGS)
        try:
            for name in os.listdir(here):
                if name.startswith(SHARE_DIR_PREFIX):
                    share = os.open(name, statedir.DIR_FLAGS, dir_fd=here)
                    try:
                        os.fchown(share, uid, gid)
                    finally:
                        os.close(share)
        finally:
            os.close(here)

    def claim(self) -> bool:
        """Take the launch for ourselves (True), or learn that a supervisor has it (False)."""
        self.create()
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path / "claim", flags, FILE_MODE)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def claimant(self) -> int | None:
        """The pid of the supervisor that claimed the job (its session id), known before
        `pids.json` is; None when unclaimed, or claimed by a daemon checking for a cut launch."""
        text = _read_small(self.path / "claim")
        try:
            return int(text) if text else None
        except ValueError:
            return None

    def unclaim(self) -> None:
        (self.path / "claim").unlink(missing_ok=True)

    def pids(self) -> Pids | None:
        data = _read_json(self.path / "pids.json")
        if data is None:
            return None
        return Pids(data["supervisor"], data["supervisor_start"], data["job"], data["job_start"])

    def exit_status(self) -> ExitStatus | None:
        data = _read_json(self.path / "exit.json")
        if data is None:
            return None
        return ExitStatus(int(data["exit_code"]), float(data["at"]), bool(data.get("oom")))

    def log_size(self, stream: str) -> int:
        """The size of the job's `stream` log now (0 when there is none): a follower whose offset
        is past it knows the log was cut to its tail and starts again from the top."""
        if stream not in STREAMS:
            raise InvalidRequest(f"unknown stream {stream!r}: use stdout or stderr")
        fd = _open_regular(self.log(stream))
        if fd is None:
            return 0
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def read_log(self, stream: str, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of the job's `stream` log ("stdout" or "stderr") from `offset`;
        b"" when there is none (yet) or it is not a regular file. The file is its user's: it
        is opened non-blocking, never through a link, and read in one bounded pread."""
        if stream not in STREAMS:
            raise InvalidRequest(f"unknown stream {stream!r}: use stdout or stderr")
        fd = _open_regular(self.log(stream))
        if fd is None:
            return b""
        try:
            return os.pread(fd, max(0, limit), max(0, offset))
        except OSError:
            return b""
        finally:
            os.close(fd)
