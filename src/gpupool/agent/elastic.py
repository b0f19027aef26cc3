"""Elastic memory in the daemon: suspend and resume of running shim jobs, preemption by
suspension, and the budgets of low jobs' bursts.

A request is written into the job's accounting region (isolation/elastic.py) and recorded in the
store (elastic_store.py); the library in each of the job's processes carries it out and
acknowledges it there, and the queue loop's `tick` reads the acknowledgements: a suspended job's
memory is free for admission once every process has moved it to the host. A job asked to resume
waits, in queue order and behind any queued job ahead of it, until its GPUs have room for its
share again, then is told to run and holds its memory from that moment. A low job's burst may sit
on a GPU only in room no share holds and no queued job waits for: while a job waits, every burst
goes to host memory (so a high job is never refused memory a burst holds), and admission counts
what a burst still has on a GPU as taken until it has gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.agent import elastic_store as rows_db
from gpupool.agent import node
from gpupool.agent.elastic_store import RESUME, RUN, SUSPEND, ElasticRow
from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job, State, queue_order
from gpupool.agent.logs import about_job
from gpupool.agent.resize import apply_compute, apply_memory, plan_resize
from gpupool.agent.store import Store
from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, format_bytes
from gpupool.isolation import elastic as region_io
from gpupool.isolation.launch import find_shared_region
from gpupool.scheduler.gpus import GpuView


def require_shim(job: Job, doing: str) -> None:
    """InvalidRequest, one line, unless `job` runs in mode shim (what `doing` needs)."""
    if job.state is not State.RUNNING:
        raise InvalidRequest(
            f"job {job.id} is {job.state.value}: only a running job can be {doing}"
        )
    if job.spec.mode is not Mode.SHIM:
        raise InvalidRequest(
            f"job {job.id} runs in mode {job.spec.mode.value}: only mode shim jobs can be {doing} "
            "(their memory is moved by the interception library)"
        )


def resume_order(job: Job, row: ElasticRow) -> tuple[int, float, int]:
    """Resumes by priority, then preempted jobs in queue order, then the others in the order
    they were asked: a job asked to resume later never takes the room freed for an earlier one
    (a service's swap in, whose swap out was for it, waited behind lower job ids for a minute)."""
    rank, job_id = queue_order(job)
    return rank, 0.0 if row.then_resume else row.since, job_id


class ElasticJobs:
    """Suspend, resume, preemption and bursts; thread-safe (API calls and the queue loop)."""

    def __init__(
        self,
        store: Store,
        jobdir: Callable[[int], JobDir],
        reserve: int,
        set_weight: Callable[[int, int], None],
    ) -> None:
        self._store = store
        #: a job's compute weight at the node's arbiter: (job id, percent)
        self._set_weight = set_weight
        self._jobdir = jobdir
        self._reserve = reserve
        self._lock = threading.Lock()
        #: what `ps` and `describe` show of each job, as of the last tick
        self._shown: dict[int, dict[str, Any]] = {}
        #: bytes each burst job still has on each of its GPUs, as of the last tick
        self._burst_on: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._budgets: dict[int, int] = {}

    def region(self, job: Job) -> Path | None:
        return find_shared_region(self._jobdir(job.id).path)

    def read(self, job: Job) -> region_io.ShareMemory | None:
        path = self.region(job)
        if path is None:
            return None
        try:
            return region_io.read(path)
        except ConfigError as err:
            about_job(job).warning("%s", err)
            return None

    def rows(self) -> dict[int, ElasticRow]:
        return rows_db.rows(self._store)

    # -- commands -------------------------------------------------------------------------------

    def suspend(self, job: Job, why: str, then_resume: bool = False) -> None:
        """Ask `job` to suspend: its processes move its memory to host memory."""
        require_shim(job, "suspended")
        with self._lock:
            row = self.rows().get(job.id)
            if row is not None and row.want in (SUSPEND, RESUME):
                raise InvalidRequest(f"job {job.id} is already suspended")
            if row is not None:
                raise InvalidRequest(f"job {job.id} is resuming: suspend it once it runs again")
            path = self.region(job)
            state = region_io.read(path) if path is not None else None
            if path is None or state is None:
                raise InvalidRequest(f"job {job.id} holds no GPU memory yet: nothing to suspend")
            region_io.request(path, region_io.SUSPEND, state.seq + 1)
            rows_db.put(
                self._store, job.id, SUSPEND, ("suspend", why), then_resume=then_resume, reason=why
            )

    def resume(self, job: Job, who: str) -> None:
        """Ask `job` to resume: it does when its GPUs have room for its share again."""
        require_shim(job, "resumed")
        with self._lock:
            row = self.rows().get(job.id)
            if row is None or row.want == RUN:
                raise InvalidRequest(f"job {job.id} is not suspended")
            if row.want == RESUME:
                why = "; ".join(self._shown.get(job.id, {}).get("waiting", [])) or "room"
                raise InvalidRequest(f"job {job.id} already waits to resume: {why}")
            rows_db.put(
                self._store,
                job.id,
                RESUME,
                ("resume", f"asked by {who}"),
                released=row.released,
                reason=row.reason,
            )

    def resize(
        self,
        job: Job,
        memory: str | None,
        compute: int | None,
        running: Sequence[Job],
        capacity: Sequence[GpuView],
    ) -> str:
        """Give the running `job` a new memory (a size or a %) or compute (milli-GPU) share on
        its GPUs, admission re-checked there; what changed, in a line."""
        with self._lock:
            if job.id in self.rows():
                raise InvalidRequest(f"job {job.id} is suspended or resuming: resume it first")
            path = self.region(job) if job.spec.mode is Mode.SHIM else None
            state = region_io.read(path) if path is not None else None
            others = [j for j in self.occupying(running, {}) if j.id != job.id]
            spec, memory_now, detail = plan_resize(
                job, memory, compute, state, self.less_bursts(capacity), others, self._reserve
            )
            assert path is not None  # plan_resize refused a job without a region
            if memory is not None:
                apply_memory(path, memory_now)
            if compute is not None:
                apply_compute(
                    job, path, max(1, round(compute * 100 / MILLI_PER_GPU)), self._set_weight
                )
            rows_db.resize(self._store, job.id, spec, memory_now, detail)
            return detail

    # -- the queue loop -------------------------------------------------------------------------

    def occupying(self, running: Sequence[Job], rows: dict[int, ElasticRow]) -> list[Job]:
        """The running jobs whose memory admission counts (not suspended)."""
        return [j for j in running if not (j.id in rows and rows[j.id].frees_memory)]

    def room_back(self, job: Job, running: Sequence[Job], capacity: Sequence[GpuView]) -> bool:
        """Whether the suspended `job`'s GPUs have room for its share now: a resume asked now
        would not wait for another's memory to leave first."""
        occupying = self.occupying(running, self.rows())
        free = self.less_bursts(node.free_now(capacity, occupying, self._reserve))
        return self._lack(job, free) is None

    def less_bursts(self, gpus: Sequence[GpuView]) -> tuple[GpuView, ...]:
        """`gpus` less what bursts still hold on them."""
        on: dict[int, int] = {}
        for job_gpus, held in self._burst_on.values():
            for gpu, size in zip(job_gpus, held, strict=False):
                on[gpu] = on.get(gpu, 0) + size
        return tuple(
            replace(g, memory_free=max(0, g.memory_free - on.get(g.index, 0))) for g in gpus
        )

    def tick(
        self, running: Sequence[Job], capacity: Sequence[GpuView], waiting: Sequence[Job]
    ) -> None:
        """Read the acknowledgements, resume what may resume, set the bursts' budgets.
        `waiting`: the queued jobs that wait for room."""

        def queue_waits(job: Job) -> bool:
            return any(queue_order(q) < queue_order(job) for q in waiting)

        with self._lock:
            rows = self.rows()
            by_id = {job.id: job for job in running}
            # only the regions there is something to read in: a job asked to suspend or resume,
            # or with a burst (a node's other jobs cost the loop nothing)
            states = {
                job.id: self.read(job)
                for job in running
                if job.spec.mode is Mode.SHIM and (job.id in rows or job.spec.memory_burst)
            }
            for job_id, row in rows.items():
                job = by_id.get(job_id)
                if job is None:
                    rows_db.forget(self._store, job_id)
                    continue
                rows[job_id] = self._settle(job, row, states.get(job_id))
            rows = {k: v for k, v in rows.items() if k in by_id}
            why = self._resume_in_order(running, rows, capacity, queue_waits, states)
            self._set_budgets(running, rows, capacity, bool(waiting), states)
            self._shown = {
                job.id: self._summary(rows.get(job.id), states.get(job.id), why.get(job.id))
                for job in running
                if job.id in rows or job.spec.memory_burst
            }

    def _settle(self, job: Job, row: ElasticRow, state: region_io.ShareMemory | None) -> ElasticRow:
        if state is None:
            return row
        if row.want in (SUSPEND, RESUME) and not row.released:
            if state.control == region_io.SUSPEND and state.settled():
                moved = format_bytes(sum(state.host_bytes))
                want = RESUME if row.then_resume else row.want
                rows_db.put(
                    self._store,
                    job.id,
                    want,
                    ("suspended", f"{moved} moved to host memory; its GPU memory is free"),
                    released=True,
                    then_resume=row.then_resume,
                    reason=row.reason,
                )
                return replace(row, want=want, released=True)
        elif row.want == RUN and state.control == region_io.RUN and state.settled():
            rows_db.forget(self._store, job.id, ("resumed", "its memory is back, same addresses"))
            return replace(row, want="")
        return row

    def _lack(self, job: Job, free: Sequence[GpuView]) -> str | None:
        by_index = {g.index: g for g in free}
        for gpu, share in zip(job.gpus, job.memory, strict=False):
            need = node.held(job.spec, share, self._reserve)
            have = by_index[gpu].memory_free if gpu in by_index else 0
            if need > have:
                return (
                    f"GPU {gpu} has {format_bytes(have)} free for shares, "
                    f"it needs {format_bytes(need)} back"
                )
        return None

    def _resume_in_order(
        self,
        running: Sequence[Job],
        rows: dict[int, ElasticRow],
        capacity: Sequence[GpuView],
        queue_waits: Callable[[Job], bool],
        states: dict[int, region_io.ShareMemory | None],
    ) -> dict[int, list[str]]:
        waiting: dict[int, list[str]] = {}
        asked = sorted(
            (j for j in running if j.id in rows and rows[j.id].want == RESUME),
            key=lambda job: resume_order(job, rows[job.id]),
        )
        blocked = False
        for job in asked:
            if not rows[job.id].released:
                waiting[job.id] = ["its suspension is still under way"]
                continue
            occupying = self.occupying(running, rows)
            free = self.less_bursts(node.free_now(capacity, occupying, self._reserve))
            lack = self._lack(job, free)
            if blocked or queue_waits(job) or lack is not None:
                why = lack or "a job ahead of it in the queue waits for room first"
                waiting[job.id] = ["waiting to resume: " + why]
                blocked = True  # in order: no later job jumps ahead of this one
                continue
            path, state = self.region(job), states.get(job.id)
            if path is None or state is None:
                continue
            region_io.request(path, region_io.RUN, state.seq + 1)
            rows_db.put(self._store, job.id, RUN, ("resuming", "its GPUs have room again"))
            rows[job.id] = replace(rows[job.id], want=RUN, released=False)
        return waiting

    def _set_budgets(
        self,
        running: Sequence[Job],
        rows: dict[int, ElasticRow],
        capacity: Sequence[GpuView],
        queue_blocked: bool,
        states: dict[int, region_io.ShareMemory | None],
    ) -> None:
        """Room no share holds goes to the bursts, in queue order; none while a job waits."""
        free = {
            g.index: g.memory_free for g in node.free_now(capacity, self.occupying(running, rows))
        }
        bursting = sorted((j for j in running if j.spec.memory_burst), key=queue_order)
        self._burst_on = {}
        for job in bursting:
            state, path = states.get(job.id), self.region(job)
            if state is None or path is None:
                continue
            n = len(job.gpus)
            self._burst_on[job.id] = (job.gpus, state.burst_on_device[:n])
            wants = job.spec.burst_bytes()
            budget = (
                0 if queue_blocked else max(0, min([wants, *(free.get(g, 0) for g in job.gpus)]))
            )
            for gpu in job.gpus:
                free[gpu] = free.get(gpu, 0) - budget
            if self._budgets.get(job.id) != budget:
                try:
                    region_io.set_burst_budget(path, range(n), budget)
                    self._budgets[job.id] = budget
                except ConfigError as err:
                    about_job(job).warning("%s", err)
        for job_id in [j for j in self._budgets if j not in {b.id for b in bursting}]:
            del self._budgets[job_id]

    def _summary(
        self,
        row: ElasticRow | None,
        state: region_io.ShareMemory | None,
        waiting: list[str] | None,
    ) -> dict[str, Any]:
        shown = "running"
        if row is not None and row.want == SUSPEND:
            shown = "suspended" if row.released else "suspending"
        elif row is not None and row.want == RESUME:
            shown = "suspended"
        elif row is not None and row.want == RUN:
            shown = "resuming"
            if state is not None and state.waiting_for_room():
                # admission found room, the GPU did not: memory held outside the shares
                waiting = [*(waiting or []), "its processes find no room on the GPU yet"]
        return {
            "state": shown,
            "reason": row.reason if row is not None else "",
            "host_bytes": sum(state.host_bytes) if state else 0,
            "burst_bytes": sum(state.burst_used) if state else 0,
            "burst_on_device": sum(state.burst_on_device) if state else 0,
            "waiting": waiting or [],
        }

    def shown(self, job_id: int) -> dict[str, Any] | None:
        """What `ps` and `describe` show of the job's elastic memory (None: nothing to show)."""
        return self._shown.get(job_id)

    # -- preemption -----------------------------------------------------------------------------

    def preempt(
        self,
        blocked: Sequence[Job],
        running: Sequence[Job],
        fits_without: Callable[[Job, list[Job]], bool],
    ) -> None:
        """For the first blocked high job that would start were some low shim jobs suspended,
        suspend the fewest of them (the newest first); they resume by themselves, in order,
        when room returns. One suspension at a time: none while one is under way."""
        with self._lock:
            rows = self.rows()
        if any(r.want in (SUSPEND, RESUME) and not r.released for r in rows.values()):
            return
        victims = sorted(
            (
                j
                for j in self.occupying(running, rows)
                if j.spec.priority is Priority.LOW and j.spec.mode is Mode.SHIM and j.id not in rows
            ),
            key=lambda j: j.started_at or 0.0,
            reverse=True,
        )
        for job in blocked:
            if job.spec.priority is not Priority.HIGH or job.spec.mode is not Mode.SHIM:
                continue
            for count in range(1, len(victims) + 1):
                if fits_without(job, victims[:count]):
                    for victim in victims[:count]:
                        try:
                            self.suspend(victim, f"preempted by job {job.id}", then_resume=True)
                        except InvalidRequest as err:
                            about_job(victim).info("not preempted: %s", err)
                    return
