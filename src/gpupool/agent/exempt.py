"""The watchdog's exemption list: GPU processes outside gpupool that the node runs on purpose (a
monitoring agent with a CUDA context, an administrator's benchmark), by name or by user.

`--watchdog-exempt` / GPUPOOL_WATCHDOG_EXEMPT is a comma-separated list of process names (the
command name `gpupool gpus` shows, /proc/PID/comm) and `uid:N` entries. Such a process, when it
belongs to no job, is reported once as exempt and never killed.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.errors import InvalidRequest

#: the kernel keeps a command name in 16 bytes, the last a NUL: a longer name never matches
MAX_NAME = 15
UID_PREFIX = "uid:"


@dataclass(frozen=True)
class Exemptions:
    names: frozenset[str] = frozenset()
    uids: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Exemptions:
        """The list `text` stands for; a bad entry is refused with one line."""
        names: set[str] = set()
        uids: set[int] = set()
        for raw in text.split(","):
            entry = raw.strip()
            if entry.startswith(UID_PREFIX):
                uids.add(_uid(entry))
            else:
                names.add(_name(entry, text))
        return cls(frozenset(names), frozenset(uids))

    def why(self, name: str, uid: int | None) -> str | None:
        """What exempts a process of this name and user (`name Xorg`, `uid 0`), or None."""
        if name in self.names:
            return f"name {name}"
        if uid is not None and uid in self.uids:
            return f"uid {uid}"
        return None

    def __str__(self) -> str:
        entries = sorted(self.names) + [f"{UID_PREFIX}{uid}" for uid in sorted(self.uids)]
        return ",".join(entries) or "none"


#: the list when none is given
NO_EXEMPTIONS = Exemptions()


def _refuse(what: str) -> InvalidRequest:
    return InvalidRequest(
        f"invalid watchdog exemption {what} (--watchdog-exempt, GPUPOOL_WATCHDOG_EXEMPT): "
        "use comma-separated process names and uid:N"
    )


def _uid(entry: str) -> int:
    number = entry.removeprefix(UID_PREFIX).strip()
    if not number.isdigit():
        raise _refuse(f"{entry!r}: a uid is a number")
    return int(number)


def _name(entry: str, text: str) -> str:
    if not entry:
        raise _refuse(f"{text!r}: an empty name")
    if len(entry.encode()) > MAX_NAME:
        raise _refuse(
            f"{entry!r}: longer than the {MAX_NAME} bytes of a command name "
            f"(the kernel shows {entry.encode()[:MAX_NAME].decode(errors='ignore')!r})"
        )
    return entry
