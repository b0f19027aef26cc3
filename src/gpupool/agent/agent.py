"""The daemon's core: admission at submit, the queue loop, job ends, cancel, drain, recovery.

One loop thread reconciles (job ends from the supervisors' exit files, cancel deadlines) and
starts what the queue allows (MIG jobs through migschedule.py); a sampler thread (sampler.py)
reads the GPUs for live usage and health. API calls and the loop share the store, which
serialises every change as one transaction. A job whose bookkeeping fails is failed alone; a
failing pass is logged once and retried with backoff; finished jobs are pruned after
`keep_finished_s`. What the API reads goes through `view` (view.py), the commands through the
methods here.
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

from gpupool.agent import launcher, mps, node
from gpupool.agent.arbiters import NodeArbiter
from gpupool.agent.config import AgentConfig
from gpupool.agent.elastic import ElasticJobs
from gpupool.agent.elastic_store import RUN
from gpupool.agent.jobdir import JobDir, alive, jobs_dir, remove_unknown
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.leases import held_leases
from gpupool.agent.logs import Failures, log
from gpupool.agent.migjobs import MigJobs
from gpupool.agent.migschedule import MigScheduler
from gpupool.agent.mpsjobs import MpsJobs
from gpupool.agent.observe import Observations
from gpupool.agent.queue import Start, plan
from gpupool.agent.sampler import Sampler
from gpupool.agent.service_manager import ServiceManager
from gpupool.agent.service_parking import Parking
from gpupool.agent.store import Store
from gpupool.agent.target import LiveTarget
from gpupool.agent.view import NodeView
from gpupool.agent.watchdog import Watchdog
from gpupool.core.errors import GpupoolError, InvalidRequest, StoreBusy, Unschedulable
from gpupool.core.resources import Mode
from gpupool.core.units import format_bytes
from gpupool.devices.backend import GpuBackend
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.arbiter_control import node_arbiter_dir
from gpupool.isolation.node import launch_node
from gpupool.scheduler.gpu_placement import check_possible
from gpupool.scheduler.gpus import GpuView

__all__ = ["Agent", "AgentConfig"]

#: how often the queue loop prunes finished jobs and trims the node events
PRUNE_EVERY_S = 60.0


class Agent:
    """The node daemon's state machine; thread-safe."""

    def __init__(self, config: AgentConfig, backend: GpuBackend) -> None:
        self.config = config
        self.backend = backend
        self.store = Store(config.state_dir / "state.db")
        self.jobs_dir = jobs_dir(config.state_dir)
        self._backend_lock = threading.Lock()
        snapshot = self._snapshot()
        self.launch_node = launch_node(backend)
        default_reserve = 0 if backend.simulated else node.DEFAULT_CONTEXT_RESERVE
        self.context_reserve: int = (
            default_reserve if config.context_reserve is None else config.context_reserve
        )
        #: the node's trusted compute arbiter, which the daemon keeps running
        self.arbiter = NodeArbiter(node_arbiter_dir(self.launch_node.sim_node), config.state_dir)
        self.watchdog = Watchdog(
            self.store,
            config.watchdog,
            self.context_reserve,
            self.jobdir,
            config.watchdog_exempt,
            lambda running: held_leases(self.arbiter, running, self.launch_node),
        )
        self.mig = MigJobs(self.store, backend, self._backend_lock, config.mig_keep_instances)
        self._mig_scheduler = MigScheduler(
            self.mig, self.store, self._snapshot, self._launch, self._fail_start
        )
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._waiting: dict[int, tuple[str, ...]] = {}
        self._cancel_at: dict[int, float] = {}
        self._threads: list[threading.Thread] = []
        #: for /metrics, the dashboard and `top`
        self.observed = Observations(sample_s=config.sample_s)
        self.mps = mps.MpsControl(
            config.state_dir / "mps",
            mps.control_command(backend.simulated),
            [gpu.uuid for gpu in snapshot.gpus],
        )
        self.mps_jobs = MpsJobs(self.mps, lambda job_id: self.jobdir(job_id).path)
        self.sampler = Sampler(
            self.store,
            self._snapshot,
            self.observed,
            self.watchdog,
            self.mps_jobs,
            self.context_reserve,
            snapshot,
        )
        #: what the node has, for "never fits": a GPU lost for a while still counts
        self.inventory = self.sampler.capacity
        #: the shapes the placement policy expects next (recent submissions)
        self.target = LiveTarget(self.store)
        self.elastic = ElasticJobs(
            self.store, self.jobdir, self.context_reserve, self.arbiter.set_job_weight
        )
        #: admission (the loop's) and a resize (an API call's) one at a time
        self._admission = threading.Lock()
        #: what the API, /metrics and the dashboard read
        self.view = NodeView(
            config,
            self.store,
            self.sampler,
            self.watchdog,
            self.mps_jobs,
            self.jobdir,
            lambda job_id: self._waiting.get(job_id, ()),
            context_reserve=self.context_reserve,
            simulated=backend.simulated,
            target_workload=self.target.describe,
            elastic=self.elastic.shown,
        )
        #: services: their replicas are jobs submitted through `submit` (service_manager.py)
        daemon = config.access.daemon_uid
        self.services = ServiceManager(
            self.store,
            self.submit,
            self.cancel,
            self.check_fits,
            lambda job_id: self._waiting.get(job_id, ()),
            config.access,
            Parking(
                lambda job_id: self.suspend(job_id, daemon, "gpupool (a service scaled to zero)"),
                lambda job_id: self.resume(job_id, daemon, "gpupool (a request to its service)"),
                self._elastic_state,
            ),
        )
        self.view.services = self.services
        self._pruned_at = -PRUNE_EVERY_S
        #: one prune at a time (the loop's and an admin's); rmtree of one dir twice would race
        self._prune_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Recover what the last daemon left, then run the loop and the sampler."""
        self.recover()
        self._keep_arbiter()
        sampler = partial(self.sampler.run, self._stop, self.config.sample_s)
        for target, name in ((self._loop, "gpupool-queue"), (sampler, "gpupool-sampler")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.services.start()

    def stop(self) -> None:
        """Stop the threads; running jobs go on (their supervisors outlive the daemon)."""
        self.services.stop()
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.arbiter.close()
        self.store.close()

    def jobdir(self, job_id: int) -> JobDir:
        return JobDir(self.jobs_dir / str(job_id), self.config.max_log_size)

    def recover(self) -> None:
        """Re-adopt running jobs, record the ends that happened meanwhile, requeue cut launches."""
        for job in self.store.jobs([State.RUNNING]):
            jobdir = self.jobdir(job.id)
            if jobdir.exit_status() is not None or jobdir.pids() is not None:
                continue  # the loop records its end, or adopts it
            if jobdir.claim():
                jobdir.unclaim()
                self.store.requeue(job.id, "the daemon stopped before the launch began")
                continue
            deadline = time.monotonic() + 5
            while jobdir.pids() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if jobdir.pids() is None:
                self.store.finish(
                    job.id,
                    State.FAILED,
                    None,
                    finished_at=time.time(),
                    detail="its supervisor died while starting it",
                )
        for job in self.store.jobs([State.RUNNING]):
            if job.cancel_requested:
                self._cancel_at[job.id] = time.monotonic()
            if self.jobdir(job.id).exit_status() is None and self.jobdir(job.id).pids():
                self.store.note(job.id, "adopted", "by a restarted daemon")
        for job_id, detail in self.mig.recover():
            self.store.note(job_id, "mig", detail)

    # -- commands ---------------------------------------------------------------------------

    def submit(self, spec: JobSpec, uid: int, user: str) -> Job:
        """Store a job, or refuse one that can never fit this node (nothing stored)."""
        spec.check_bounds()  # again: a caller may have changed `env`, a dict, since it was made
        if spec.mode is Mode.MIG:
            job = self.store.add(self.mig.check_submit(spec, self._snapshot()), uid, user)
            self._mig_scheduler.changed()
            self._wake.set()
            return job
        self.check_fits(spec)
        job = self.store.add(spec, uid, user)
        self.target.submitted(spec.request())
        self._wake.set()
        return job

    def check_fits(self, spec: JobSpec) -> None:
        """Unschedulable for a share (not MIG) that can never fit this node."""
        try:
            check_possible(spec.request(), self.inventory)
        except Unschedulable as err:
            if not self.context_reserve:
                raise
            reserve = format_bytes(self.context_reserve)
            raise Unschedulable(
                f"{err} for shares (each job also needs {reserve} per GPU for its CUDA context: "
                "gpupool serve --context-reserve)"
            ) from None

    def cancel(self, job_id: int, uid: int, user: str) -> Job:
        job = self.store.job(job_id)
        self.config.access.require_owner(uid, job.uid, job_id, "cancel it")
        if job.state.finished:
            raise InvalidRequest(f"job {job_id} has already finished ({job.state.value})")
        if job.state is State.QUEUED:
            self.store.finish(
                job_id,
                State.CANCELLED,
                None,
                finished_at=time.time(),
                detail=f"cancelled by {user} while queued",
            )
        else:
            self.store.request_cancel(job_id, user)
            with self._lock:
                self._cancel_at[job_id] = time.monotonic()
            self._signal(self.store.job(job_id), signal.SIGTERM)
        self._wake.set()
        return self.store.job(job_id)

    def suspend(self, job_id: int, uid: int, user: str) -> Job:
        """Move a running shim job's memory to host memory and free its GPU memory."""
        job = self.store.job(job_id)
        self.config.access.require_owner(uid, job.uid, job_id, "suspend it")
        self.elastic.suspend(job, f"asked by {user}")
        self._wake.set()
        return self.store.job(job_id)

    def resume(self, job_id: int, uid: int, user: str) -> Job:
        """Bring a suspended job back (when its GPUs have room for it again)."""
        job = self.store.job(job_id)
        self.config.access.require_owner(uid, job.uid, job_id, "resume it")
        self.elastic.resume(job, user)
        self._wake.set()
        return self.store.job(job_id)

    def _elastic_state(self, job_id: int) -> tuple[str, str]:
        """A job's elastic state ("" when it simply runs, suspending, suspended, resuming) and
        why its resume waits for room."""
        row = self.elastic.rows().get(job_id)
        if row is None:
            return "", ""
        if row.want == RUN:  # a request waits for it: the queue loop reads its acknowledgement now
            self._wake.set()
            return "resuming", ""
        if not row.released:
            return "suspending", ""
        shown = self.elastic.shown(job_id) or {}
        waits = [w for w in shown.get("waiting", []) if w.startswith("waiting to resume")]
        return "suspended", "; ".join(waits)

    def resize(
        self, job_id: int, uid: int, memory: str | None, compute: int | None
    ) -> tuple[Job, str]:
        """Change a running shim job's memory (a size or a %) or compute (milli-GPU) share;
        the job as it is now and what changed."""
        job = self.store.job(job_id)
        self.config.access.require_owner(uid, job.uid, job_id, "resize it")
        with self._admission:
            running = [j for j in self.store.jobs([State.RUNNING]) if j.spec.mode is not Mode.MIG]
            capacity = [g for g in self.sampler.capacity if g.index not in self.sampler.mig_mode]
            detail = self.elastic.resize(job, memory, compute, running, capacity)
        self._wake.set()
        return self.store.job(job_id), detail

    def drain(self, on: bool, uid: int) -> None:
        """Stop starting jobs (on) or start them again, for `uid` if an admin."""
        self.config.access.require_admin(uid, "draining the node" if on else "ending a drain")
        self.store.set_setting("draining", "1" if on else "0")
        self._wake.set()

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = Failures("the queue loop", self.config.tick_s)
        while not self._stop.is_set():
            wait = self.config.tick_s
            try:
                self._keep_arbiter()
                self.reconcile()
                with self._admission:
                    self._elastic_tick()
                    self.schedule()
                self._prune_now_and_then()
                failures.succeeded()
            except Exception as err:  # a full disk, a locked store, a bug: the node goes on
                wait = failures.failed(err)
            self._wake.wait(wait)
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
        waiting = [j for j in self.store.jobs([State.QUEUED]) if j.id in self._waiting]
        self.elastic.tick(running, capacity, waiting)

    def _each_job(self, job: Job, doing: str, step: Callable[[], object]) -> None:
        """`step()` for `job`; when it fails, the job fails with the reason and the others go
        on. A busy store is no fault of the job: the whole pass is retried."""
        try:
            step()
        except StoreBusy:
            raise
        except Exception as err:
            log.exception("job %d: %s failed", job.id, doing)
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
        with self._lock:
            self._cancel_at.pop(job.id, None)
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
        for region in jobdir.path.glob("gpupool-share-*"):
            shutil.rmtree(region, ignore_errors=True)
        if job.spec.mode is Mode.MIG:
            self._mig_scheduler.ended(job.id)

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
        mps_users = {job.gpus[0]: job.uid for job in running if job.spec.mode is Mode.MPS}
        for start in decided.starts:
            if start.job.spec.mode is Mode.MPS:
                owner = mps_users.setdefault(start.gpus[0], start.job.uid)
                if owner != start.job.uid:  # MPS serves one user per GPU at a time
                    self._waiting[start.job.id] = (
                        f"GPU {start.gpus[0]}'s MPS server serves uid {owner} until their MPS "
                        "jobs there end",
                    )
                    continue
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

    # -- pruning ------------------------------------------------------------------------------

    def _prune_now_and_then(self) -> None:
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        self.prune(self.config.keep_finished_s)
        self.store.trim_node_events()

    def prune(self, older_than_s: float) -> int:
        """Delete the jobs that finished more than `older_than_s` ago, their events and their
        directories; how many jobs went."""
        if not older_than_s >= 0:  # NaN too
            raise InvalidRequest(f"invalid age {older_than_s:g}: must not be negative")
        with self._prune_lock:
            pruned = self.store.prune(time.time() - older_than_s)
            self.view.forget(pruned)
            remove_unknown(self.jobs_dir, self.store.job_ids)
        if pruned:
            log.info("pruned %d jobs finished more than %gs ago", len(pruned), older_than_s)
        return len(pruned)

    def _snapshot(self) -> NodeSnapshot:
        with self._backend_lock:
            return self.backend.snapshot()
