"""Which running job a process belongs to: by its process group, its session, or an ancestor.

The supervisor detaches into a session of its own (its pid is the session id) and starts the job
as the leader of a new process group (the job's pid is the group id). So a process of the job is
in the job's group; one that left the group (setpgid) is still in the supervisor's session; one
that left the session too (setsid) still descends from the job. Only a process that also got
itself re-parented (a double fork) belongs to no job, which is what the watchdog reports it as.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job

#: how far up the parent chain to look (a deeper chain is no job's: init is never that far)
MAX_DEPTH = 64


@dataclass(frozen=True)
class Lineage:
    """What /proc/PID/stat says about where a process comes from."""

    parent: int
    group: int
    session: int


def lineage(pid: int) -> Lineage | None:
    """Fields 4-6 of /proc/PID/stat, or None when the pid is gone (or hidden from us)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return Lineage(int(fields[1]), int(fields[2]), int(fields[3]))


def identified(job: Job, jobdir: Callable[[int], JobDir]) -> Job:
    """`job` with its pids even when just launched: the store learns them on the loop's next
    pass, but the job may already be on a GPU by then, and must not be taken for a stranger.
    Its directory has them (`pids.json`), or at least its supervisor's (the claim)."""
    if job.job_pid is not None:
        return job
    directory = jobdir(job.id)
    pids = directory.pids()
    if pids is not None:
        return replace(job, job_pid=pids.job, supervisor_pid=pids.supervisor)
    return replace(job, supervisor_pid=directory.claimant())


class Owners:
    """Maps pids to the running jobs they belong to (built once per watchdog pass)."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self._by_group: dict[int, int] = {}
        self._by_session: dict[int, int] = {}
        for job in jobs:
            if job.job_pid is not None:
                self._by_group[job.job_pid] = job.id
            if job.supervisor_pid is not None:
                self._by_session[job.supervisor_pid] = job.id

    def job_of(self, pid: int) -> int | None:
        """The id of the job `pid` belongs to, or None (a foreign or escaped process)."""
        current = pid
        for _ in range(MAX_DEPTH):
            if current in self._by_group:  # the job's own pid, or an ancestor that is
                return self._by_group[current]
            seen = lineage(current)
            if seen is None:
                return None
            job = self._by_group.get(seen.group) or self._by_session.get(seen.session)
            if job is not None:
                return job
            if seen.parent <= 1:
                return None
            current = seen.parent
        return None
