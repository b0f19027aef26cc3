"""The daemon's core: admission at submit, the queue loop, job ends, cancel, drain, recovery.

One loop thread reconciles (job ends from the supervisors' exit files, cancel deadlines) and
starts what the queue allows; a sampler thread reads the GPUs for live usage and health. API
calls and the loop share the store, which serialises every change as one transaction. A job
whose bookkeeping fails is failed alone; a failing pass is logged once and retried with backoff;
finished jobs are pruned after `keep_finished_s`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from gpupool.agent import launcher, mps, node
from gpupool.agent.access import Access
from gpupool.agent.exempt import NO_EXEMPTIONS, Exemptions
from gpupool.agent.jobdir import DEFAULT_MAX_LOG_SIZE, MIN_LOG_SIZE, JobDir, alive, jobs_dir
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.logs import Failures, log
from gpupool.agent.migjobs import MigJobs
from gpupool.agent.mpsjobs import MpsJobs
from gpupool.agent.observe import Observations
from gpupool.agent.queue import Start, plan
from gpupool.agent.store import Store
from gpupool.agent.usage import Usage, job_usage
from gpupool.agent.watchdog import Action, Watchdog
from gpupool.core.errors import GpupoolError, InvalidRequest, StoreBusy, Unschedulable
from gpupool.core.resources import Mode
from gpupool.core.settings import DAEMON
from gpupool.core.units import format_bytes
from gpupool.devices.backend import GpuBackend
from gpupool.isolation.arbiter import prepare_arbiters
from gpupool.isolation.launch import arbiter_dir, memory_bytes
from gpupool.isolation.node import launch_node
from gpupool.scheduler.gpu_placement import GPU_POLICIES, Target, check_possible

#: the longest a queued MIG job waits for a new look at the GPUs' MIG layouts
MIG_REPLAN_S = 1.0
#: how often the queue loop prunes finished jobs and trims the node events
PRUNE_EVERY_S = 60.0
#: a finished job's listing entry is kept encoded up to this size (most are under 1 KiB)
MAX_LISTED_BYTES = 4096


@dataclass(frozen=True)
class AgentConfig:
    state_dir: Path
    policy: str = DAEMON.policy
    cancel_grace_s: float = DAEMON.cancel_grace_s
    tick_s: float = 0.1
    sample_s: float = 1.0
    #: bytes set aside per job and GPU for what the share does not count (its CUDA context);
    #: None: node.DEFAULT_CONTEXT_RESERVE on real GPUs, nothing on a simulated node, whose
    #: driver charges a context nothing
    context_reserve: int | None = None
    #: what the watchdog does with a GPU process of no job or a job over its share
    watchdog: Action = Action.REPORT
    #: GPU processes of no job the watchdog reports as exempt and never kills
    watchdog_exempt: Exemptions = NO_EXEMPTIONS
    #: leave the MIG instances created for jobs in place after them
    mig_keep_instances: bool = False
    #: each job's stdout and stderr keep at most this many bytes, the newest (0: no limit)
    max_log_size: int = DEFAULT_MAX_LOG_SIZE
    #: who may act on whose jobs and drain the node (default: this process's user is the admin)
    access: Access = field(default_factory=lambda: Access(os.geteuid()))
    #: finished jobs, their events and directories are deleted this long after they finished
    keep_finished_s: float = 14 * 86400

    def __post_init__(self) -> None:
        if self.max_log_size and self.max_log_size < MIN_LOG_SIZE:
            raise InvalidRequest(
                f"invalid maximum log size {self.max_log_size} bytes (--max-log-size): "
                f"0 for no limit, or at least {MIN_LOG_SIZE // 1024}Ki"
            )
        if self.policy not in GPU_POLICIES:
            raise InvalidRequest(
                f"unknown policy {self.policy!r}; valid policies: {', '.join(GPU_POLICIES)}"
            )


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
        self.capacity = node.capacity(snapshot, self.context_reserve)
        self.watchdog = Watchdog(
            self.store,
            config.watchdog,
            self.context_reserve,
            self.jobdir,
            config.watchdog_exempt,
        )
        #: GPUs in MIG mode: only MIG jobs run there
        self._mig_mode = _mig_mode(snapshot)
        self.mig = MigJobs(self.store, backend, self._backend_lock, config.mig_keep_instances)
        #: what the node has, for "never fits": a GPU lost for a while still counts
        self.inventory = self.capacity
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._live: dict[int, Usage] = {}
        self._peaks: dict[int, int] = {}
        self._waiting: dict[int, tuple[str, ...]] = {}
        self._cancel_at: dict[int, float] = {}
        self._threads: list[threading.Thread] = []
        #: for /metrics, the dashboard and `top`
        self.observed = Observations(sample_s=config.sample_s)
        self.observed.sampled(snapshot, {})
        self.mps = mps.MpsControl(
            config.state_dir / "mps",
            mps.control_command(backend.simulated),
            [gpu.uuid for gpu in snapshot.gpus],
        )
        self.mps_jobs = MpsJobs(self.mps, lambda job_id: self.jobdir(job_id).path)
        # MIG jobs are placed from a device snapshot: taken when a MIG job came or went, else at
        # most every MIG_REPLAN_S (an admin may change the layout), not at every tick
        self._mig_changed = True
        self._mig_planned_at = 0.0
        self._mig_waiting: dict[int, tuple[str, ...]] = {}
        self._pruned_at = -PRUNE_EVERY_S
        #: the encoded listing entry of each finished job (see jobs_json)
        #: each finished job's listing entry, encoded: (its owner, as its owner and the admins
        #: see it, as others see it: no command)
        self._listed: dict[int, tuple[int, bytes, bytes]] = {}
        #: one prune at a time (the loop's and an admin's); rmtree of one dir twice would race
        self._prune_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Recover what the last daemon left, then run the loop and the sampler."""
        self.recover()
        uuids = [gpu.uuid for gpu in self._snapshot().gpus]
        prepare_arbiters(arbiter_dir(self.launch_node.sim_node), uuids)
        for target, name in ((self._loop, "gpupool-queue"), (self._sampler, "gpupool-sampler")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop the threads; running jobs go on (their supervisors outlive the daemon)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
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

    # -- API --------------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.store.setting("draining") == "1"

    def submit(self, spec: JobSpec, uid: int, user: str) -> Job:
        """Store a job, or refuse one that can never fit this node (nothing stored)."""
        spec.check_bounds()  # again: a caller may have changed `env`, a dict, since it was made
        if spec.mode is Mode.MIG:
            job = self.store.add(self.mig.check_submit(spec, self._snapshot()), uid, user)
            self._mig_changed = True
            self._wake.set()
            return job
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
        job = self.store.add(spec, uid, user)
        self._wake.set()
        return job

    def job(self, job_id: int) -> Job:
        return self._with_mig([self.store.job(job_id)])[0]

    def jobs(self, everything: bool = False) -> list[Job]:
        """Jobs by id (queued and running ones, or all)."""
        states = None if everything else [State.QUEUED, State.RUNNING]
        return self._with_mig(sorted(self.store.jobs(states), key=lambda job: job.id))

    def jobs_json(
        self,
        everything: bool,
        render: Callable[[Job], dict[str, Any]],
        may_see: Callable[[int], bool],
    ) -> bytes:
        """`{"jobs": [render(job), ...]}` by id (queued and running jobs, or all), as JSON; a
        job whose owner's uid `may_see` refuses is listed without its command. A finished job
        never changes, so its entries (`render` must depend on the job alone) are encoded once
        and kept until the job is pruned: `ps --all` on a node with 10,000 finished jobs then
        costs the open jobs, not the 10,000 (bench/ps_latency.py)."""
        if everything:
            ids, read = self.store.listing(self._listed)
            unlisted = {job.id: job for job in self._with_mig(list(read.values()))}
        else:
            open_jobs = self.jobs()
            ids = [(job.id, False) for job in open_jobs]
            unlisted = {job.id: job for job in open_jobs}
        parts = []
        for job_id, finished in ids:
            entry = self._listed.get(job_id) if finished else None
            if entry is None:
                job = unlisted.get(job_id)
                if job is None:  # pruned since it was listed
                    continue
                entry = _listing_entry(job.uid, render(job))
                if finished and len(entry[1]) <= MAX_LISTED_BYTES:
                    self._listed[job_id] = entry
            owner, full, hidden = entry
            parts.append(full if may_see(owner) else hidden)
        return b'{"jobs":[' + b",".join(parts) + b"]}"

    def _with_mig(self, jobs: list[Job]) -> list[Job]:
        """`jobs` with the MIG instance each MIG job holds."""
        uses = self.store.mig_uses(released=True)
        return [replace(job, mig=uses.get(job.id)) if job.id in uses else job for job in jobs]

    def live(self, job_id: int) -> Usage | None:
        return self._live.get(job_id)

    def describe(self, job_id: int) -> dict[str, Any]:
        job = self.job(job_id)
        data = job.to_json()
        data["events"] = self.store.events(job_id)
        data["waiting"] = list(self._waiting.get(job_id, ())) if job.state is State.QUEUED else []
        if self.context_reserve and any(" memory " in line for line in data["waiting"]):
            data["waiting"].append(
                f"(free memory is net of {format_bytes(self.context_reserve)} per job and GPU "
                "for CUDA contexts: gpupool serve --context-reserve)"
            )
        if job.state is State.QUEUED and self.draining:
            data["waiting"].insert(0, "the node is draining: nothing new starts")
        return data

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

    def drain(self, on: bool, uid: int) -> None:
        """Stop starting jobs (on) or start them again, for `uid` if an admin."""
        self.config.access.require_admin(uid, "draining the node" if on else "ending a drain")
        self.store.set_setting("draining", "1" if on else "0")
        self._wake.set()

    def node_json(self) -> dict[str, Any]:
        running = self.store.jobs([State.RUNNING])
        free = node.free_now(self.capacity, running, self.context_reserve)
        gpus = []
        for cap, now in zip(self.capacity, free, strict=True):
            # shares and their context reserves, summed (free room clips at zero)
            admitted = sum(
                node.held(job.spec, memory, self.context_reserve)
                for job in running
                for index, memory in zip(job.gpus, job.memory, strict=False)
                if index == cap.index
            )
            gpus.append(
                {
                    "index": cap.index,
                    "model": cap.model,
                    "healthy": cap.healthy,
                    "memory_total": cap.memory_total + self.context_reserve
                    if cap.memory_total
                    else 0,
                    "memory_admitted": admitted,
                    "compute_admitted": 1000 - now.compute_free,
                    "jobs": [j.id for j in running if cap.index in j.gpus],
                    "mps": self.mps_jobs.of_gpu(cap.index, running),
                }
            )
        return {
            "policy": self.config.policy,
            "draining": self.draining,
            "simulated": self.backend.simulated,
            "context_reserve": self.context_reserve,
            "gpus": gpus,
        }

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = Failures("the queue loop", self.config.tick_s)
        while not self._stop.is_set():
            wait = self.config.tick_s
            try:
                self.reconcile()
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
        with self._lock:
            peak = self._peaks.pop(job.id, None)
            self._live.pop(job.id, None)
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
            self._release_mig(job.id)
            self._mig_changed = True

    def _release_mig(self, job_id: int) -> None:
        released = self.mig.release(job_id)
        if released is not None:
            self.store.note(job_id, "mig", released)

    def _signal(self, job: Job, sig: signal.Signals) -> None:
        pids = self.jobdir(job.id).pids()
        if pids is None or not alive(pids.job, pids.job_start):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pids.job, sig)

    def _target(self, jobs: list[Job]) -> Target:
        counts = Counter(job.spec.request() for job in jobs)
        total = sum(counts.values())
        return tuple((shape, n / total) for shape, n in counts.items())

    def schedule(self) -> None:
        """Start what the queue allows now (nothing while draining)."""
        if self.draining:  # `describe` says so; nothing else to work out
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
        capacity = [gpu for gpu in self.capacity if gpu.index not in self._mig_mode]
        free = node.free_now(capacity, running, self.context_reserve)
        decided = plan(
            queued,
            running,
            free,
            capacity,
            self.config.policy,
            self._target(queued + running),
            self.context_reserve,
        )
        mig_lines = tuple(
            f"GPU {i}: in MIG mode, for MIG jobs only" for i in sorted(self._mig_mode)
        )
        self._waiting = {job: why + mig_lines for job, why in decided.waiting.items()}
        self.observed.scheduling.observe(time.perf_counter() - began)
        if mig_queued:
            self._schedule_mig(mig_queued)
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

    def _start(self, start: Start) -> None:
        where = ", ".join(str(g) for g in start.gpus)
        detail = f"GPUs {where}" + (" (backfill)" if start.backfill else "")
        job = self.store.start(start.job, start.gpus, start.memory, detail)
        try:
            launcher.launch(job, self.launch_node, self.jobdir(job.id), self.mps)
        except (GpupoolError, OSError) as err:  # the expected ways: one line, no traceback
            self._fail_start(job, f"launch failed: {err}")

    def _schedule_mig(self, queued: list[Job]) -> None:
        now = time.monotonic()
        if not self._mig_changed and now - self._mig_planned_at < MIG_REPLAN_S:
            self._waiting.update(self._mig_waiting)
            return
        self._mig_changed, self._mig_planned_at = False, now
        choices, waiting = self.mig.plan(queued, self._snapshot())
        self._mig_waiting = waiting
        self._waiting.update(waiting)
        for choice in choices:
            try:
                use = self.mig.acquire(choice)
            except GpupoolError as err:
                self._fail_start(choice.job, f"cannot make its MIG instance: {err}")
                continue
            how = "created" if use.created else "free"
            # the share inside the instance, or all of it
            memory = memory_bytes(choice.job.spec.memory_share(), use.memory_total)
            job = self.store.start(
                choice.job, (use.gpu,), (memory or use.memory_total,), f"{use.label} ({how})"
            )
            try:
                launcher.launch(
                    replace(job, mig=use), self.launch_node, self.jobdir(job.id), self.mps
                )
            except Exception as err:  # any failure fails this job alone
                if not isinstance(err, GpupoolError | OSError):  # not an expected way: a bug
                    log.exception("job %d: launch failed", job.id)
                self._fail_start(job, f"launch failed: {err}")
                self._release_mig(job.id)

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
            for job_id in pruned:
                self._listed.pop(job_id, None)
            self._remove_job_dirs()
        if pruned:
            log.info("pruned %d jobs finished more than %gs ago", len(pruned), older_than_s)
        return len(pruned)

    def _remove_job_dirs(self) -> None:
        """Remove every job directory whose job the store no longer holds (pruned now, or by
        a prune cut short), relative to the jobs dir's fd and without following a link: a
        job's owner writes in its directory and may leave links there."""
        fd = os.open(self.jobs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            # listed before the ids are read: a job's row is written before its directory,
            # so a directory listed here whose id is not in the store has been pruned
            names = [name for name in os.listdir(fd) if name.isdigit()]
            known = self.store.job_ids()
            for name in names:
                if int(name) not in known:
                    shutil.rmtree(name, dir_fd=fd, onerror=_removal_failed)
        finally:
            os.close(fd)

    # -- the sampler --------------------------------------------------------------------------

    def _snapshot(self) -> Any:
        with self._backend_lock:
            return self.backend.snapshot()

    def _sampler(self) -> None:
        failures = Failures("reading the GPUs", self.config.sample_s)
        wait = self.config.sample_s
        while not self._stop.wait(wait):
            wait = self.config.sample_s
            try:
                self.sample()
                failures.succeeded()
            except Exception as err:  # a lost GPU, a driver error, a bug: the node goes on
                wait = max(wait, failures.failed(err))

    def sample(self) -> None:
        snapshot = self._snapshot()
        self.capacity = node.capacity(snapshot, self.context_reserve)
        self._mig_mode = _mig_mode(snapshot)
        running = self.store.jobs([State.RUNNING])
        groups = {job.job_pid: job.id for job in running if job.job_pid is not None}
        usage = job_usage(snapshot, groups)
        self.observed.sampled(snapshot, groups)
        with self._lock:
            self._live = usage
            for job_id, now in usage.items():
                self._peaks[job_id] = max(self._peaks.get(job_id, 0), now.memory)
        if usage:
            self.store.record_peak({job_id: u.memory for job_id, u in usage.items()})
        servers = {self.mps_jobs.server_pid(job) for job in running}
        self.watchdog.check(snapshot, running, {pid for pid in servers if pid is not None})


def _removal_failed(function: Any, path: str, info: Any) -> None:
    """A job directory that cannot be removed in full: told, and tried again at the next prune."""
    error = info[1] if isinstance(info, tuple) else info
    if not isinstance(error, FileNotFoundError):
        log.warning("cannot remove jobs/%s: %s", path, error)


def _listing_entry(owner: int, data: dict[str, Any]) -> tuple[int, bytes, bytes]:
    """A job's listing entry as its owner sees it and as others do (no command). ASCII
    (escaped) JSON: no stored string can make the answer unencodable."""
    full = json.dumps(data).encode()
    hidden = json.dumps({**data, "command": None}).encode()
    return owner, full, hidden


def _mig_mode(snapshot: Any) -> frozenset[int]:
    return frozenset(g.index for g in snapshot.gpus if g.mig is not None and g.mig.current)
