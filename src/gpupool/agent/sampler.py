"""The sampler: one GPU snapshot per `sample_s` for live usage, peaks, health and the watchdog."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpupool.agent import node
from gpupool.agent.jobs import State
from gpupool.agent.logs import Failures
from gpupool.agent.mpsjobs import MpsJobs
from gpupool.agent.observe import Observations
from gpupool.agent.store import Store
from gpupool.agent.usage import Usage, job_usage
from gpupool.agent.watchdog import Watchdog
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.scheduler.gpus import GpuView


class Sampler:
    """Reads the GPUs once a sample; the queue loop reads the capacity and MIG mode it saw, the
    view each job's live usage, and a job's end takes its peak."""

    def __init__(
        self,
        store: Store,
        read_gpus: Callable[[], NodeSnapshot],
        observed: Observations,
        watchdog: Watchdog,
        mps_jobs: MpsJobs,
        reserve: int,
        first: NodeSnapshot,
    ) -> None:
        self.store = store
        self._read_gpus = read_gpus
        self.observed = observed
        self.watchdog = watchdog
        self.mps_jobs = mps_jobs
        self.reserve = reserve
        #: each GPU's room for shares as last seen (a lost GPU is unhealthy)
        self.capacity: tuple[GpuView, ...] = node.capacity(first, reserve)
        #: GPUs in MIG mode: only MIG jobs run there
        self.mig_mode = node.in_mig_mode(first)
        self._lock = threading.Lock()
        self._live: dict[int, Usage] = {}
        self._peaks: dict[int, int] = {}
        observed.sampled(first, {})

    def run(self, stop: threading.Event, every_s: float) -> None:
        """Sample every `every_s` until `stop`; a failing read backs off and is told once."""
        failures = Failures("reading the GPUs", every_s)
        wait = every_s
        while not stop.wait(wait):
            wait = every_s
            try:
                self.sample()
                failures.succeeded()
            except Exception as err:  # a lost GPU, a driver error, a bug: the node goes on
                wait = max(wait, failures.failed(err))

    def sample(self) -> None:
        snapshot = self._read_gpus()
        self.capacity = node.capacity(snapshot, self.reserve)
        self.mig_mode = node.in_mig_mode(snapshot)
        running = self.store.jobs([State.RUNNING])
        groups = {job.job_pid: job.id for job in running if job.job_pid is not None}
        usage = job_usage(snapshot, groups)
        self.observed.sampled(snapshot, groups)
        with self._lock:
            self._live = usage
            # only the jobs running at this sample: one that ended while it was taken is gone
            # from the store, and its entry must not outlive it
            running_ids = set(groups.values())
            self._peaks = {i: p for i, p in self._peaks.items() if i in running_ids}
            for job_id, now in usage.items():
                self._peaks[job_id] = max(self._peaks.get(job_id, 0), now.memory)
        if usage:
            self.store.record_peak({job_id: u.memory for job_id, u in usage.items()})
        servers = {self.mps_jobs.server_pid(job) for job in running}
        self.watchdog.check(snapshot, running, {pid for pid in servers if pid is not None})

    def live(self, job_id: int) -> Usage | None:
        """The job's usage at the last sample (None: not running then, or no GPU process)."""
        return self._live.get(job_id)

    def ended(self, job_id: int) -> int | None:
        """Forget an ended job; the most memory it was seen holding."""
        with self._lock:
            self._live.pop(job_id, None)
            return self._peaks.pop(job_id, None)
