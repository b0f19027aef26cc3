"""What /proc says about a process, for both backends (NVML gives pids, not names)."""

from __future__ import annotations

from pathlib import Path


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def process_name(pid: int) -> str:
    """The command name of `pid` (/proc/PID/comm), empty when the pid is gone or hidden."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def process_uid(pid: int) -> int | None:
    """The effective uid of `pid` (the user `ps` shows), or None when the pid is gone or hidden."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])  # real, effective, saved, filesystem
    return None
