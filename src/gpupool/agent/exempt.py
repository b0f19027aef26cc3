"""The watchdog's exemption list: GPU processes outside gpupool that the node runs on purpose (a
monitoring agent with a CUDA context, an administrator's benchmark), by executable or by user.

`--watchdog-exempt` / GPUPOOL_WATCHDOG_EXEMPT is a comma-separated list of absolute executable
paths and `uid:N` entries. Such a process, when it belongs to no job, is reported once as exempt
and never killed. Never by command name: a process sets its own (prctl, or a link named
anything), so a name would exempt whatever chose it. The executable is what the kernel says the
process runs (/proc/PID/exe, a path without links); a listed path is resolved once, so
/usr/bin/python3 exempts the interpreter it links to.

That path is only what the process's own mount namespace shows: a user with unprivileged user
and mount namespaces can bind-mount any program over /usr/lib/xorg/Xorg in a namespace of their
own, and its /proc/PID/exe then reads /usr/lib/xorg/Xorg. So a process runs an exempted path only
when it is in the host's mount namespace (the daemon's, or init's) and runs the very file the
daemon finds at that path (same device and inode).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.core.errors import InvalidRequest

UID_PREFIX = "uid:"
#: what the kernel appends to /proc/PID/exe when the executable was removed or replaced
_DELETED = " (deleted)"


@dataclass(frozen=True)
class Exemptions:
    paths: frozenset[str] = frozenset()
    uids: frozenset[int] = frozenset()
    #: who else holds a process the daemon did not start, by pid (`slurm job 12`: a share its
    #: Slurm node made), or None
    held: Callable[[int], str | None] | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, text: str) -> Exemptions:
        """The list `text` stands for; a bad entry is refused with one line."""
        paths: set[str] = set()
        uids: set[int] = set()
        for raw in text.split(","):
            entry = raw.strip()
            if entry.startswith(UID_PREFIX):
                uids.add(_uid(entry))
            else:
                paths.add(_path(entry, text))
        return cls(frozenset(paths), frozenset(uids))

    def why(self, executable: str | None, uid: int | None) -> str | None:
        """What exempts a process running `executable` as `uid` (`path /usr/bin/dcgm`,
        `uid 0`), or None."""
        if executable is not None and executable in self.paths:
            return f"path {executable}"
        if uid is not None and uid in self.uids:
            return f"uid {uid}"
        return None

    def __str__(self) -> str:
        entries = sorted(self.paths) + [f"{UID_PREFIX}{uid}" for uid in sorted(self.uids)]
        return ",".join(entries) or "none"


#: the list when none is given
NO_EXEMPTIONS = Exemptions()


def executable(pid: int) -> str | None:
    """The host's file that process `pid` runs, by its path; None when gone, hidden from us
    (another user's process, to a daemon not run as root), removed since it started, or not the
    host's file at that path (another mount namespace, or another file there)."""
    try:
        target = os.readlink(f"/proc/{pid}/exe")
        if target.endswith(_DELETED) or not _in_host_mounts(pid):
            return None
        running, there = os.stat(f"/proc/{pid}/exe"), os.stat(target)
    except OSError:
        return None
    same_file = (running.st_dev, running.st_ino) == (there.st_dev, there.st_ino)
    return target if same_file else None


def _in_host_mounts(pid: int) -> bool:
    """Whether process `pid` sees the host's mounts: its mount namespace is the daemon's or
    init's (a daemon in a namespace of its own still exempts the host's own programs)."""
    theirs = os.stat(f"/proc/{pid}/ns/mnt").st_ino
    return any(theirs == _namespace(of) for of in ("self", "1"))


def _namespace(of: str) -> int | None:
    """The inode of process `of`'s mount namespace; None when hidden (init's, to a daemon not
    run as root)."""
    try:
        return os.stat(f"/proc/{of}/ns/mnt").st_ino
    except OSError:
        return None


def _refuse(what: str) -> InvalidRequest:
    return InvalidRequest(
        f"invalid watchdog exemption {what} (--watchdog-exempt, GPUPOOL_WATCHDOG_EXEMPT): "
        "use comma-separated absolute executable paths and uid:N"
    )


def _uid(entry: str) -> int:
    number = entry.removeprefix(UID_PREFIX).strip()
    if not number.isdigit():
        raise _refuse(f"{entry!r}: a uid is a number")
    return int(number)


def _path(entry: str, text: str) -> str:
    if not entry:
        raise _refuse(f"{text!r}: an empty entry")
    if not entry.startswith("/"):
        raise _refuse(
            f"{entry!r}: name the executable by its absolute path (as `readlink "
            f"/proc/PID/exe` shows it), not by a name, which any process can give itself"
        )
    return os.path.realpath(entry)
