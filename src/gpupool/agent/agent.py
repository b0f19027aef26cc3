"""The daemon's core: its parts, start-up and recovery, and the commands (submit, cancel, drain...).

The queue loop (agent_loop.py, the `Agent`'s base) reconciles job ends and cancel deadlines and
starts what the queue allows; a sampler thread (sampler.py) reads the GPUs for live usage and
health. API calls and the loop share the store, which serialises every change as one
transaction. What the API reads goes through `view` (view.py), the commands through the methods
here.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from gpupool.agent import heap, mps, node
from gpupool.agent.agent_loop import PRUNE_EVERY_S, QueueLoop
from gpupool.agent.arbiters import NodeArbiter
from gpupool.agent.config import AgentConfig
from gpupool.agent.elastic import ElasticJobs
from gpupool.agent.elastic_store import RUN
from gpupool.agent.jobdir import jobs_dir, require_known
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.leases import held_leases
from gpupool.agent.migjobs import MigJobs
from gpupool.agent.migschedule import MigScheduler
from gpupool.agent.mpsjobs import MpsJobs
from gpupool.agent.observe import Observations
from gpupool.agent.sampler import Sampler
from gpupool.agent.service_manager import ServiceManager
from gpupool.agent.service_parking import Parking
from gpupool.agent.store import Store
from gpupool.agent.target import LiveTarget
from gpupool.agent.view import NodeView
from gpupool.agent.watchdog import Watchdog
from gpupool.core.errors import ConfigError, GpupoolError, InvalidRequest, Unschedulable
from gpupool.core.resources import Mode
from gpupool.core.settings import DAEMON
from gpupool.core.units import format_bytes
from gpupool.devices.backend import GpuBackend
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.arbiter_control import node_arbiter_dir
from gpupool.isolation.node import launch_node
from gpupool.scheduler.gpu_placement import check_possible

__all__ = ["Agent", "AgentConfig"]


class Agent(QueueLoop):
    """The node daemon's state machine; thread-safe."""

    def __init__(self, config: AgentConfig, backend: GpuBackend) -> None:
        self.config = config
        self.backend = backend
        self.jobs_dir = jobs_dir(config.state_dir)
        self.store = _store_of(self.jobs_dir, config.state_dir / "state.db")
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
            node_dir=sim.directory if (sim := backend.simulated_node()) is not None else None,
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
                self._holds,
                _parked_memory(config),
                self._room_back,
            ),
        )
        self.view.services = self.services
        self._pruned_at = -PRUNE_EVERY_S
        #: one prune at a time (the loop's and an admin's); rmtree of one dir twice would race
        self._prune_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Recover what the last daemon left, then run the loop and the sampler."""
        heap.limit_arenas()  # before the daemon's threads first allocate
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
        stored = self.submit_many([(spec, uid, user)])[0]
        if isinstance(stored, GpupoolError):
            raise stored
        return stored

    def submit_many(self, submits: Sequence[tuple[JobSpec, int, str]]) -> list[Job | GpupoolError]:
        """`submit` for each (spec, uid, user), in order: the job stored, or why it was refused.
        Each is checked apart from the others; the shares that pass are stored in one
        transaction (a flood of submits costs a commit per batch), and a store that fails
        fails them all."""
        outcome: dict[int, Job | GpupoolError] = {}
        shares: list[int] = []
        for i, (spec, uid, user) in enumerate(submits):
            try:
                # again: a caller may have changed `env`, a dict, since it was made
                spec.check_bounds()
                if spec.mode is Mode.MIG:  # its instance is checked and recorded on its own
                    outcome[i] = self.store.add(
                        self.mig.check_submit(spec, self._snapshot()), uid, user
                    )
                    self._mig_scheduler.changed()
                else:
                    self.check_fits(spec)
                    shares.append(i)
            except GpupoolError as err:
                outcome[i] = err
        if shares:
            batch = [submits[i] for i in shares]
            stored: Sequence[Job | GpupoolError]
            try:
                with self.target.submitting([spec.request() for spec, _, _ in batch]) as window:
                    stored = self.store.add_many(batch, settings=window)
            except GpupoolError as err:
                stored = [err] * len(batch)
            outcome.update(zip(shares, stored, strict=True))
        self._wake.set()
        return [outcome[i] for i in range(len(submits))]

    def check_fits(self, spec: JobSpec) -> None:
        """Unschedulable for a share (not MIG) that can never fit this node; InvalidRequest for
        a burst its host memory could never back."""
        node.check_burst(spec, node.host_memory() + sum(g.memory_total for g in self.inventory))
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

    def _room_back(self, job_id: int) -> bool:
        """Whether a suspended job's GPUs have room for its memory to come back at once."""
        try:
            job = self.store.job(job_id)
        except GpupoolError:
            return True
        running = [j for j in self.store.jobs([State.RUNNING]) if j.spec.mode is not Mode.MIG]
        capacity = [g for g in self.sampler.capacity if g.index not in self.sampler.mig_mode]
        return self.elastic.room_back(job, running, capacity)

    def _holds(self, job_id: int) -> int:
        """The bytes a running shim job has allocated, on its GPUs or moved to host memory
        (its region counts an allocation as used wherever it lies)."""
        try:
            job = self.store.job(job_id)
        except GpupoolError:
            return 0
        state = self.elastic.read(job) if job.spec.mode is Mode.SHIM else None
        return sum(state.used) if state is not None else 0

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

    def _snapshot(self) -> NodeSnapshot:
        with self._backend_lock:
            return self.backend.snapshot()


def _store_of(jobs: Path, database: Path) -> Store:
    """The store at `database`, refused (one line, nothing deleted or created) when it does not
    go with the job directories in `jobs`: a missing or empty database beside them would start
    anew, reuse their ids, and prune them as unknown, logs included."""
    try:
        size = database.lstat().st_size
    except FileNotFoundError:
        require_known(jobs, 0, f"{database} is missing")
    else:
        if size == 0:
            require_known(jobs, 0, f"{database} is empty")
    store = Store(database)
    last = store.last_job_id()
    try:
        require_known(jobs, last, f"the newest it assigned is {last}")
    except ConfigError:
        store.close()
        raise
    return store


def _parked_memory(config: AgentConfig) -> int:
    """The host bytes services' parked replicas may hold together (`serve --parked-memory`)."""
    if config.parked_memory is not None:
        return config.parked_memory
    return int(node.host_memory() * DAEMON.parked_memory_fraction)
