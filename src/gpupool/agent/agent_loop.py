"""The daemon's queue loop: job ends, cancel deadlines, starts in queue order, pruning.

One loop thread (`QueueLoop._loop`) reconciles (job ends from the supervisors' exit files,
cancel deadlines) and starts what the queue allows (MIG jobs through migschedule.py). A job
whose bookkeeping fails is failed alone; a failing pass is logged once and retried with backoff;
finished jobs are pruned after `keep_finished_s`. The `Agent` (agent.py) builds the parts it
works on and runs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from gpupool.agent import heap, launcher, node
from gpupool.agent.arbiters import NodeArbiter
from gpupool.agent.config import AgentConfig
from gpupool.agent.elastic import ElasticJobs
from gpupool.agent.jobdir import JobDir, alive, remove_unknown
from gpupool.agent.jobs import Job, State
from gpupool.agent.logs import Failures, about_job, log
from gpupool.agent.migschedule import MigScheduler
from gpupool.agent.mps import MpsControl
from gpupool.agent.mpsjobs import MpsJobs
from gpupool.agent.observe import Observations
from gpupool.agent.queue import Start, plan
from gpupool.agent.sampler import Sampler
from gpupool.agent.store import Store
from gpupool.agent.target import LiveTarget
from gpupool.agent.view import NodeView
from gpupool.core.errors import GpupoolError, InvalidRequest, StoreBusy
from gpupool.core.resources import Mode
from gpupool.isolation.node import LaunchNode
from gpupool.scheduler.gpus import GpuView

#: how often the queue loop prunes finished jobs and trims the node events
PRUNE_EVERY_S = 60.0
#: the least time from the start of one pass of the queue loop to the next
PASS_GAP_S = 0.005
#: the queue loop's pace while no job waits or runs (tick_s otherwise)
IDLE_TICK_S = 1.0


class QueueLoop:
    """The loop's half of the `Agent`, which sets every part below in its constructor."""

    config: AgentConfig
    store: Store
    jobs_dir: Path
    launch_node: LaunchNode
    context_reserve: int
    arbiter: NodeArbiter
    observed: Observations
    mps: MpsControl
    mps_jobs: MpsJobs
    sampler: Sampler
    target: LiveTarget
    elastic: ElasticJobs
    view: NodeView
    _mig_scheduler: MigScheduler
    #: guards the cancel deadlines
    _lock: threading.RLock
    _wake: threading.Event
    _stop: threading.Event
    #: why each queued job waits, from the last pass (for `describe`)
    _waiting: dict[int, tuple[str, ...]]
    _cancel_at: dict[int, float]
    _admission: threading.Lock
    _pruned_at: float
    _prune_lock: threading.Lock

    def jobdir(self, job_id: int) -> JobDir:
        return JobDir(self.jobs_dir / str(job_id), self.config.max_log_size)

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = Failures("the queue loop", self.config.tick_s)
        while not self._stop.is_set():
            wait = self.config.tick_s
            began = time.monotonic()
            try:
                self._keep_arbiter()
                self.reconcile()
                with self._admission:
                    self._elastic_tick()
                    self.schedule()
                self._prune_now_and_then()
                failures.succeeded()
                if not self.store.has_jobs([State.QUEUED, State.RUNNING]):
                    # nothing waits or runs: only a command, which wakes the loop, changes that
                    wait = IDLE_TICK_S
            except Exception as err:  # a full disk, a locked store, a bug: the node goes on
                wait = failures.failed(err)
            self._wake.wait(wait)
            # a flood of submits, each of which wakes the loop, is taken a batch per pass
            self._stop.wait(PASS_GAP_S - (time.monotonic() - began))
            self._wake.clear()

    def reconcile(self) -> None:
        """Record ended jobs, adopt launched ones, enforce cancel deadlines."""
        for job in self.store.jobs([State.RUNNING]):
            self._each_job(job, "bookkeeping", partial(self._reconcile_one, job))
        self._watch_mps()

    def _reconcile_one(self, job: Job) -> None:
        jobdir = self.jobdir(job.id)
        ended = jobdir.exit_status()
        if ended is not None:
            self._finish(job, jobdir, ended.exit_code, ended.at)
            return
        pids = jobdir.pids()
        if pids is None:
            return
        if job.job_pid is None:
            self.store.launched(job.id, (pids.supervisor, pids.supervisor_start), pids.job)
        elif not alive(pids.supervisor, pids.supervisor_start) and jobdir.exit_status() is None:
            self._finish(job, jobdir, None, time.time(), "its supervisor was killed")
            return
        started = self._cancel_at.get(job.id)
        if started is not None and time.monotonic() - started > self.config.cancel_grace_s:
            self._signal(job, signal.SIGKILL)

    def _elastic_tick(self) -> None:
        running = [j for j in self.store.jobs([State.RUNNING]) if j.spec.mode is not Mode.MIG]
        capacity = [g for g in self.sampler.capacity if g.index not in self.sampler.mig_mode]
        # the queued jobs that wait for room, read by id: reading every queued job here cost
        # each pass (a submit wakes one) time in the number of queued jobs
        waiting = self.store.jobs_among(self._waiting, [State.QUEUED]) if self._waiting else []
        self.elastic.tick(running, capacity, waiting)

    def _each_job(self, job: Job, doing: str, step: Callable[[], object]) -> None:
        """`step()` for `job`; when it fails, the job fails with the reason and the others go
        on. A busy store is no fault of the job: the whole pass is retried."""
        try:
            step()
        except StoreBusy:
            raise
        except Exception as err:
            about_job(job).exception("%s failed", doing)
            with contextlib.suppress(Exception):  # its processes must not outlive its record
                self._signal(job, signal.SIGKILL)
            self._fail_start(job, f"{doing} failed: {type(err).__name__}: {err}")

    def _watch_mps(self) -> None:
        for job, reason in self.mps_jobs.lost_servers(self.store.jobs([State.RUNNING])):
            self.store.note(job.id, "mps", reason)
            self._signal(job, signal.SIGKILL)

    def _finish(
        self, job: Job, jobdir: JobDir, code: int | None, at: float, detail: str = ""
    ) -> None:
        mps_failure = self.mps_jobs.failure(job, code)
        if job.cancel_requested:
            state = State.CANCELLED
        elif mps_failure:
            state = State.FAILED
        else:
            state = State.SUCCEEDED if code == 0 else State.FAILED
        peak = self.sampler.ended(job.id)
        words = detail or mps_failure
        words = words or (f"exit code {code}" if code is not None else "exit code unknown")
        # the supervisor saw the interception library's out-of-memory line go by
        ended = jobdir.exit_status()
        self.store.finish(
            job.id,
            state,
            code,
            finished_at=at,
            oom=ended is not None and ended.oom,
            peak_memory=peak,
            detail=words,
        )
        about_job(job).info("%s: %s", state.value, words)
        self._release(job)
        if job.spec.mode is Mode.MIG:
            self._mig_scheduler.ended(job.id)

    def _release(self, job: Job) -> None:
        """Give back what a job held while it ran, on every way it ends: its share at the
        compute arbiter (64 slots a GPU: one kept per ended job starved the 65th), its
        accounting regions, and what the daemon kept of it in memory."""
        self.sampler.ended(job.id)
        self.mps_jobs.ended(job.id)
        with self._lock:
            self._cancel_at.pop(job.id, None)
        # by mode alone: a launch that failed may have registered the share of a job this
        # record shows still queued (no GPUs yet); unknown to the arbiter is no harm
        if job.spec.mode in (Mode.SHIM, Mode.MIG):
            share_id = self.arbiter.share_of(f"job {job.id}").share_id
            try:
                self.arbiter.unregister(share_id)
            except GpupoolError as err:  # never registered (it ran unarbitrated), or gone
                about_job(job).debug("its arbiter share: %s", err)
        for region in self.jobdir(job.id).path.glob("gpupool-share-*"):
            shutil.rmtree(region, ignore_errors=True)

    def _signal(self, job: Job, sig: signal.Signals) -> None:
        pids = self.jobdir(job.id).pids()
        if pids is None or not alive(pids.job, pids.job_start):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pids.job, sig)

    def schedule(self) -> None:
        """Start what the queue allows now (nothing while draining)."""
        if self.view.draining:  # `describe` says so; nothing else to work out
            self._waiting = {}
            return
        queued = []
        for job in self.store.jobs([State.QUEUED]):
            if job.unreadable is None:
                queued.append(job)
            else:  # nothing to run: the command is unknown
                self._fail_start(job, job.unreadable)
        if not queued:
            self._waiting = {}
            return
        began = time.perf_counter()
        # MIG jobs have their own admission; the other modes never use a GPU in MIG mode
        mig_queued = [job for job in queued if job.spec.mode is Mode.MIG]
        queued = [job for job in queued if job.spec.mode is not Mode.MIG]
        running = [j for j in self.store.jobs([State.RUNNING]) if j.spec.mode is not Mode.MIG]
        mig_mode = self.sampler.mig_mode
        capacity = [gpu for gpu in self.sampler.capacity if gpu.index not in mig_mode]
        # a suspended job's memory is free; what a burst still has on a GPU is not
        occupying = self.elastic.occupying(running, self.elastic.rows())
        free = self.elastic.less_bursts(node.free_now(capacity, occupying, self.context_reserve))
        decided = plan(
            queued,
            occupying,
            free,
            capacity,
            self.config.policy,
            self.target.target(),
            self.context_reserve,
        )
        mig_lines = tuple(f"GPU {i}: in MIG mode, for MIG jobs only" for i in sorted(mig_mode))
        self._waiting = {job: why + mig_lines for job, why in decided.waiting.items()}
        self.observed.scheduling.observe(time.perf_counter() - began)
        if mig_queued:
            self._waiting.update(self._mig_scheduler.schedule(mig_queued))
        if self.config.preempt == "suspend" and decided.waiting:
            blocked = [job for job in queued if job.id in decided.waiting]
            self.elastic.preempt(blocked, occupying, partial(self._fits_without, capacity))
        for start in decided.starts:
            self.observed.started(start.job.submitted_at)
            self._each_job(start.job, "launch", partial(self._start, start))

    def _fits_without(self, capacity: list[GpuView], job: Job, victims: list[Job]) -> bool:
        """`job` would start now were `victims` suspended."""
        gone = {v.id for v in victims}
        rest = [j for j in self.store.jobs([State.RUNNING]) if j.spec.mode is not Mode.MIG]
        rest = [j for j in self.elastic.occupying(rest, self.elastic.rows()) if j.id not in gone]
        free = self.elastic.less_bursts(node.free_now(capacity, rest, self.context_reserve))
        trial = plan(
            [job],
            rest,
            free,
            capacity,
            self.config.policy,
            self.target.target(),
            self.context_reserve,
        )
        return bool(trial.starts)

    def _start(self, start: Start) -> None:
        where = ", ".join(str(g) for g in start.gpus)
        detail = f"GPUs {where}" + (" (backfill)" if start.backfill else "")
        job = self.store.start(start.job, start.gpus, start.memory, detail)
        try:
            self._launch(job)
        except (GpupoolError, OSError) as err:  # the expected ways: one line, no traceback
            self._fail_start(job, f"launch failed: {err}")

    def _launch(self, job: Job) -> None:
        launcher.launch(job, self.launch_node, self.jobdir(job.id), self.mps, self.arbiter)

    def _keep_arbiter(self) -> None:
        """The arbiter answers; started again (with every running share) if it does not."""
        self.arbiter.keep(
            lambda: launcher.registrations(
                self.store.jobs([State.RUNNING]), self.arbiter, self.launch_node
            )
        )

    def _fail_start(self, job: Job, detail: str) -> None:
        self.store.finish(job.id, State.FAILED, None, finished_at=time.time(), detail=detail)
        self._release(job)  # a launch that failed may have registered its share

    # -- pruning ------------------------------------------------------------------------------

    def _prune_now_and_then(self) -> None:
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        self.prune(self.config.keep_finished_s)
        self.store.trim_node_events()
        self.store.trim_job_events()
        heap.trim()

    def prune(self, older_than_s: float) -> int:
        """Delete the jobs that finished more than `older_than_s` ago, their events and their
        directories; how many jobs went."""
        if not older_than_s >= 0:  # NaN too
            raise InvalidRequest(f"invalid age {older_than_s:g}: must not be negative")
        with self._prune_lock:
            pruned = self.store.prune(time.time() - older_than_s)
            self.view.keep_listed(self.store.job_ids())
            remove_unknown(self.jobs_dir, self.store.job_ids, self.store.last_job_id)
        if pruned:
            log.info("pruned %d jobs finished more than %gs ago", len(pruned), older_than_s)
        return len(pruned)
