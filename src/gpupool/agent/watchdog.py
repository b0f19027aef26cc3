"""The watchdog: the driver's own view of the GPUs checked against the jobs, about every second.

Interception can be escaped (a process without the preload, with its own accounting file or
settings, or that fetches the real driver entry points itself), but the driver sees every process
and its memory: NVML on real GPUs, the simulated driver's process slots on a simulated node. Two
findings come out of each pass:
- `no_job`: a GPU process that belongs to no running job (foreign, or escaped from its job's
  process tree), a node event;
- `over_share`: a job whose processes hold more memory on a GPU than its share there plus one
  context reserve per process (each process has its own CUDA context, which the share does not
  count), a job event. A GPU the job was not placed on is a share of 0;
- `compute_escape`: a process of a job whose compute the arbiter holds (a limit or a priority)
  that used the GPU's time in the last sample (NVML's per-process utilisation; the simulated
  driver's per-process GPU time) in two passes running, while the arbiter knows no such process
  of its share (it never asked for a lease: it escaped the interception), a job event. Not while
  the arbiter is away or just back (the shares hold their caps alone then; leases.py).
Each is recorded once: a process (pid and start time) once per kind, a job once per GPU while
it stays over (again if it comes back under and goes over once more). With action `kill`, each
offending process gets SIGKILL (for a job over its share, all its processes on that GPU: the
driver cannot tell which one escaped), and the kill is recorded.

Two kinds of process of no job are never killed: one the driver lists as graphics only (a
display server, a desktop) is no finding at all, and one on the exemption list (by executable
or user, exempt.py) is an `exempt` node event instead of `no_job`, so the GPU's users outside
gpupool still show.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gpupool.agent.exempt import NO_EXEMPTIONS, Exemptions, executable
from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job
from gpupool.agent.leases import Leases
from gpupool.agent.logs import Context, about_job
from gpupool.agent.owners import Owners, identified
from gpupool.agent.store import Store
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import format_bytes
from gpupool.devices.procfs import process_start_time, process_uid
from gpupool.devices.snapshot import NodeSnapshot, ProcessKind

NO_JOB = "no_job"
EXEMPT = "exempt"
OVER_SHARE = "over_share"
COMPUTE_ESCAPE = "compute_escape"
KILLED = "watchdog_kill"
#: the event kinds the watchdog writes (job events and node events alike)
KINDS = (NO_JOB, EXEMPT, OVER_SHARE, COMPUTE_ESCAPE, KILLED)
#: the findings `kill` acts on (an exempt process is only reported)
KILLABLE = (NO_JOB, OVER_SHARE, COMPUTE_ESCAPE)

log = logging.getLogger(__name__)


class Action(StrEnum):
    REPORT = "report"
    KILL = "kill"

    @classmethod
    def parse(cls, text: str) -> Action:
        try:
            return cls(text)
        except ValueError:
            raise InvalidRequest(
                f"invalid watchdog action {text!r} (--watchdog, GPUPOOL_WATCHDOG): "
                "use report or kill"
            ) from None


@dataclass(frozen=True)
class GpuProcess:
    """One process on one GPU, as the last pass saw it."""

    gpu: int
    pid: int
    start: int
    name: str
    kind: ProcessKind
    memory: int | None  # the driver's figure; None where it does not say
    job: int | None
    share: int | None  # the job's memory share on this GPU (0 on a GPU it was not placed on)
    over_share: bool = False
    exempt: str | None = None  # of no job: what exempts it (`path /usr/bin/dcgm`, `uid 0`)

    @property
    def stranger(self) -> bool:
        """Of no job, and neither graphics only nor exempt: what the watchdog reports and kills."""
        return self.job is None and self.kind is not ProcessKind.GRAPHICS and self.exempt is None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "pid": self.pid,
            "name": self.name,
            "kind": self.kind.value,
            "memory": self.memory,
            "job": self.job,
            "share": self.share,
            "over_share": self.over_share,
            "exempt": self.exempt,
        }


@dataclass(frozen=True)
class Finding:
    kind: str
    gpu: int
    processes: tuple[GpuProcess, ...]
    job: int | None = None
    memory: int = 0
    allowed: int = 0

    @property
    def key(self) -> tuple[str, int, int]:
        """What makes it the same finding as last pass's: the process, or the job and GPU."""
        if self.job is None:
            return (self.kind, self.processes[0].pid, self.processes[0].start)
        return (self.kind, self.job, self.gpu)

    def detail(self) -> str:
        pids = ", ".join(f"{p.pid} ({p.name or '?'})" for p in self.processes)
        if self.kind == COMPUTE_ESCAPE:
            return (
                f"GPU {self.gpu}: pid {pids} used the GPU's time without asking the compute "
                "arbiter for a lease"
            )
        if self.job is None:
            first = self.processes[0]
            memory = "memory unknown" if first.memory is None else format_bytes(first.memory)
            line = f"GPU {self.gpu}: pid {pids} belongs to no job, {memory}"
            return line if first.exempt is None else f"{line}; exempt ({first.exempt}), not killed"
        return (
            f"GPU {self.gpu}: {format_bytes(self.memory)} in the driver, share and context "
            f"reserve {format_bytes(self.allowed)}; pid {pids}"
        )


def _of_no_job(entry: GpuProcess, exemptions: Exemptions) -> tuple[GpuProcess, Finding | None]:
    """A process of no job as the pass lists it, and its finding (`no_job`, `exempt`, or none)."""
    if entry.kind is ProcessKind.GRAPHICS:
        # Graphics only (a display server, a compositor, a desktop's GL clients): shares are
        # CUDA contexts, so this is no share's escape, and SIGKILL to Xorg would take the node's
        # display and every session on it down. Listed, but no finding.
        return entry, None
    # /proc read only when needed
    uid = process_uid(entry.pid) if exemptions.uids else None
    exe = executable(entry.pid) if exemptions.paths else None
    held = exemptions.held(entry.pid) if exemptions.held is not None else None
    entry = replace(entry, exempt=held or exemptions.why(exe, uid))
    return entry, Finding(NO_JOB if entry.exempt is None else EXEMPT, entry.gpu, (entry,))


def classify(
    snapshot: NodeSnapshot,
    jobs: Sequence[Job],
    reserve: int,
    job_of: Callable[[int], int | None],
    ignore: frozenset[int] = frozenset(),
    exemptions: Exemptions = NO_EXEMPTIONS,
    leases: Leases | None = None,
) -> tuple[list[GpuProcess], list[Finding]]:
    """Every GPU process with its job and share, and what is wrong (or exempt) among them
    (`leases`: the arbiter's clients, for compute escapes; None: not looked for)."""
    by_id = {job.id: job for job in jobs}
    seen: list[GpuProcess] = []
    findings: list[Finding] = []
    for gpu in snapshot.gpus:
        per_job: dict[int, list[GpuProcess]] = {}
        for process in gpu.processes:
            start = process_start_time(process.pid)
            if start is None or process.pid in ignore:
                continue  # gone since the driver listed it: nothing to report or kill
            job_id = job_of(process.pid)
            job = by_id.get(job_id) if job_id is not None else None
            share = dict(zip(job.gpus, job.memory, strict=False)).get(gpu.index, 0) if job else None
            entry = GpuProcess(
                gpu.index,
                process.pid,
                start,
                process.name,
                process.kind,
                process.memory_used,
                job_id,
                share,
            )
            if job_id is not None:
                # whatever its kind: a job's graphics context holds GPU memory of its share too
                per_job.setdefault(job_id, []).append(entry)
                busy = (process.gpu_utilization or 0) > 0
                if busy and leases is not None and leases.escaped(gpu.index, job_id, entry.pid):
                    findings.append(Finding(COMPUTE_ESCAPE, gpu.index, (entry,), job_id))
                continue
            entry, finding = _of_no_job(entry, exemptions)
            seen.append(entry)
            if finding is not None:
                findings.append(finding)
        for job_id, processes in per_job.items():
            used = sum(p.memory or 0 for p in processes)
            allowed = (processes[0].share or 0) + reserve * len(processes)
            over = used > allowed
            if over:
                findings.append(
                    Finding(OVER_SHARE, gpu.index, tuple(processes), job_id, used, allowed)
                )
            seen.extend(replace(p, over_share=over) for p in processes)
    return seen, findings


def kill(pid: int, start: int) -> str:
    """SIGKILL to `pid` if it is still the process that started at `start`; what happened.

    A pidfd pins the process, so a pid reused between the check and the signal is never hit.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "it had already exited"
    except OSError as err:
        return f"it could not be signalled: {err.strerror}"
    try:
        if process_start_time(pid) != start:
            return "it had already exited"
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return "killed with SIGKILL"
    except ProcessLookupError:
        return "it had already exited"
    except OSError as err:
        return f"it could not be killed: {err.strerror}"
    finally:
        os.close(fd)


class Watchdog:
    """Runs a pass per sample (on the sampler's snapshot) and records what it finds, once."""

    def __init__(
        self,
        store: Store,
        action: Action,
        reserve: int,
        jobdir: Callable[[int], JobDir],
        exemptions: Exemptions = NO_EXEMPTIONS,
        leases: Callable[[Sequence[Job]], Leases | None] | None = None,
    ) -> None:
        self.store = store
        self.leases = leases
        self.jobdir = jobdir
        self.action = action
        self.reserve = reserve
        self.exemptions = exemptions
        self.processes: list[GpuProcess] = []
        #: jobs that went over their share at least once (the mark in `ps`)
        self.flagged: set[int] = store.job_ids_with(OVER_SHARE)
        self._open: set[tuple[str, int, int]] = set()
        #: compute escapes seen in the last pass: one pass alone (a process that joined the
        #: arbiter just after its first kernel) is no finding
        self._suspects: set[tuple[str, int, int]] = set()
        self._ignore = frozenset({os.getpid()})

    def check(
        self, snapshot: NodeSnapshot, running: Sequence[Job], helpers: Collection[int] = ()
    ) -> list[Finding]:
        """One pass; the findings that are new (recorded, and acted on under `kill`).
        `helpers`: GPU processes the daemon runs for its jobs (MPS servers), never strangers."""
        running = [identified(job, self.jobdir) for job in running]
        owners = Owners(running)
        ignored = self._ignore | frozenset(helpers)
        leases = self.leases(running) if self.leases is not None else None
        processes, findings = classify(
            snapshot, running, self.reserve, owners.job_of, ignored, self.exemptions, leases
        )
        suspects = {f.key for f in findings if f.kind == COMPUTE_ESCAPE}
        findings = [f for f in findings if f.kind != COMPUTE_ESCAPE or f.key in self._suspects]
        self._suspects = suspects
        self.processes = processes
        new = [finding for finding in findings if finding.key not in self._open]
        for finding in new:
            self._record(finding, finding.kind, finding.detail())
            if self.action is Action.KILL and finding.kind in KILLABLE:
                for process in finding.processes:
                    outcome = kill(process.pid, process.start)
                    self._record(finding, KILLED, f"pid {process.pid}: {outcome}", process.pid)
        # only now: a store that failed half-way leaves the rest to be recorded next pass
        self._open = {finding.key for finding in findings}
        return new

    def _record(self, finding: Finding, kind: str, detail: str, pid: int | None = None) -> None:
        about: Context | logging.Logger = log
        if finding.job is not None:
            self.store.note(finding.job, kind, detail)
            self.flagged.add(finding.job)
            about = about_job(finding.job, log)
        else:
            first = finding.processes[0].pid
            self.store.node_event(kind, first if pid is None else pid, finding.gpu, detail)
        # an exempt process is news, not a fault; a closed stderr never stops the watchdog
        # (a logging handler swallows the OSError)
        level = logging.INFO if kind == EXEMPT else logging.WARNING
        about.log(level, "watchdog: %s: %s", kind, detail)
