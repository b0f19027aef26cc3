"""The daemon's state directory: where it is, that nobody else controls it, who holds it.

Everything the daemon trusts lives here (its database, the jobs' launch files), so the directory
and every directory above it must be out of other users' reach, as sshd's StrictModes asks of a
home directory: no symlink anywhere on the path (each component is opened with O_NOFOLLOW, from
the root down), each ancestor owned by root or the daemon's user and writable by nobody else
unless sticky (/tmp), the state dir itself owned by the daemon's user and writable by it alone.
Group read and search are allowed: with a socket group the state dir is 0750 root:GROUP, so the
group's members reach the socket and their jobs reach their files. A new state dir is 0700.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import IO

from gpupool.core.errors import ConfigError, DaemonError

LOCK_NAME = "daemon.lock"
#: what a new state dir gets; an existing one keeps its mode if nobody else can write it
STATE_DIR_MODE = 0o700
#: missing ancestors are made as `mkdir -p` makes them
_PARENT_MODE = 0o755
#: a directory opened as itself, never through a link
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
ROOT_UID = 0


def prepare(state_dir: Path) -> Path:
    """Create `state_dir` (0700) if needed and check that nobody but this user controls it or
    its path; its absolute path, or one line (ConfigError) saying what is wrong and the fix."""
    path = Path(os.path.abspath(state_dir))
    if len(path.parts) < 2:
        raise ConfigError("the state dir cannot be / itself: give a directory of its own")
    fd = os.open("/", DIR_FLAGS)
    try:
        for depth, name in enumerate(path.parts[1:], start=2):
            here = Path(*path.parts[:depth])
            last = depth == len(path.parts)
            child = _open_or_make(fd, name, here, STATE_DIR_MODE if last else _PARENT_MODE)
            os.close(fd)
            fd = child
            _check(os.fstat(fd), here, state_dir=last)
    finally:
        os.close(fd)
    return path


def _open_or_make(parent: int, name: str, here: Path, mode: int) -> int:
    """`name` in the directory `parent`, opened without following a link; made if missing."""
    try:
        return _open_dir(parent, name, here)
    except FileNotFoundError:
        pass
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile by someone else: checked as any existing one
    except OSError as err:
        raise ConfigError(f"cannot create the state dir {here}: {err.strerror}") from err
    else:
        made = _open_dir(parent, name, here)
        os.fchmod(made, mode)  # the umask must not take group or others' search from a parent
        return made
    return _open_dir(parent, name, here)


def _open_dir(parent: int, name: str, here: Path) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as err:
        if os.path.islink(here):
            raise ConfigError(
                f"{here} is a symbolic link: the state dir, what is in it and the path to it "
                "have none (give gpupool serve --state-dir a path without links)"
            ) from None
        raise ConfigError(f"cannot create the state dir {here}: {err.strerror}") from err


def _check(found: os.stat_result, here: Path, *, state_dir: bool) -> None:
    me = os.geteuid()
    if state_dir:
        if found.st_uid != me:
            raise ConfigError(
                f"the state dir {here} belongs to uid {found.st_uid}, not to this daemon's "
                f"user (uid {me}): give a directory this user owns (gpupool serve --state-dir)"
            )
        if found.st_mode & _OTHERS_WRITE:
            raise ConfigError(
                f"the state dir {here} is writable by {_who(found)} "
                f"(mode {stat.S_IMODE(found.st_mode):04o}): chmod go-w {here}"
            )
        return
    if found.st_uid not in (ROOT_UID, me):
        raise ConfigError(
            f"the state dir's parent {here} belongs to uid {found.st_uid}, who could replace "
            "the state dir: put the state dir under directories of root or this user"
        )
    if found.st_mode & _OTHERS_WRITE and not found.st_mode & stat.S_ISVTX:
        raise ConfigError(
            f"the state dir's parent {here} is writable by {_who(found)} "
            f"(mode {stat.S_IMODE(found.st_mode):04o}), who could replace the state dir: "
            f"chmod go-w {here}, or put the state dir elsewhere"
        )


def _who(found: os.stat_result) -> str:
    group = "its group" if found.st_mode & stat.S_IWGRP else ""
    others = "others" if found.st_mode & stat.S_IWOTH else ""
    return " and ".join(w for w in (group, others) if w)


def share(state_dir: Path, gid: int | None) -> None:
    """Make `state_dir` 0750 owner:`gid`, so that the socket group can reach the socket (and its
    members' jobs their job dirs), or 0700 without a socket group. Through a descriptor opened
    without following a link, so the change lands on the directory itself."""
    try:
        fd = os.open(state_dir, DIR_FLAGS)
    except OSError as err:
        raise ConfigError(f"cannot open the state dir {state_dir}: {err.strerror}") from err
    try:
        if gid is not None:
            os.fchown(fd, os.geteuid(), gid)
        os.fchmod(fd, 0o750 if gid is not None else STATE_DIR_MODE)
    except OSError as err:
        raise ConfigError(f"cannot set the state dir {state_dir}'s mode: {err.strerror}") from err
    finally:
        os.close(fd)


def hold(state_dir: Path) -> IO[str]:
    """Lock `state_dir` for this daemon (kept until the returned file closes or we die)."""
    try:
        fd = os.open(
            state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as err:
        raise ConfigError(f"cannot open {state_dir / LOCK_NAME}: {err.strerror}") from err
    os.fchmod(fd, 0o600)  # an older gpupool made it with the umask's mode
    handle = os.fdopen(fd, "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = handle.read().strip() or "another process"
        handle.close()
        raise DaemonError(
            f"another gpupool daemon (pid {holder}) already serves {state_dir}"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def private_dir(parent: Path, name: str, mode: int) -> Path:
    """`parent/name`, a directory of this user with `mode` exactly (made if missing, never
    through a link): for directories inside the state dir."""
    parent_fd = os.open(parent, DIR_FLAGS)
    try:
        with_mode = _open_or_make(parent_fd, name, parent / name, mode)
    finally:
        os.close(parent_fd)
    try:
        found = os.fstat(with_mode)
        if found.st_uid != os.geteuid():
            raise ConfigError(
                f"{parent / name} belongs to uid {found.st_uid}, not to this daemon's user: "
                "remove it"
            )
        if stat.S_IMODE(found.st_mode) != mode:
            os.fchmod(with_mode, mode)  # made by an older gpupool, with the umask's mode
    finally:
        os.close(with_mode)
    return parent / name
