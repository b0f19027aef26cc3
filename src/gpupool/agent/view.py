"""What the API, /metrics and the dashboard read of the daemon: one read-only view of the node.

Every read of the daemon's state from above the agent goes through `NodeView`: jobs (with the
MIG instance each holds, its live usage and the watchdog's mark), events, the watchdog's last
pass, the node summary, the sampler's observations and the settings worth showing. The agent's
parts stay its own, so they may change without the API noticing; what a caller may see of
another user's job is the API's to decide with `access`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.agent import node
from gpupool.agent.access import Access
from gpupool.agent.config import AgentConfig
from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job, State
from gpupool.agent.mpsjobs import MpsJobs
from gpupool.agent.observe import HistogramReading, HistoryPoint, Observations
from gpupool.agent.sampler import Sampler
from gpupool.agent.service_manager import ServiceManager
from gpupool.agent.store import Store
from gpupool.agent.usage import Usage
from gpupool.agent.watchdog import KINDS, Action, GpuProcess, Watchdog
from gpupool.core.units import format_bytes
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.launch import find_shared_region

#: a finished job's listing entry is kept encoded up to this size (most are under 1 KiB)
MAX_LISTED_BYTES = 4096


class NodeView:
    """The daemon's state, read-only; thread-safe (the store and the parts read are)."""

    def __init__(
        self,
        config: AgentConfig,
        store: Store,
        sampler: Sampler,
        watchdog: Watchdog,
        mps_jobs: MpsJobs,
        jobdir: Callable[[int], JobDir],
        waiting: Callable[[int], tuple[str, ...]],
        *,
        context_reserve: int,
        node_dir: Path | None,
        target_workload: Callable[[], list[dict[str, object]]] = list,
        elastic: Callable[[int], dict[str, Any] | None] = lambda _job_id: None,
    ) -> None:
        self._config = config
        self._store = store
        self._sampler = sampler
        self._observed: Observations = sampler.observed
        self._watchdog = watchdog
        self._mps_jobs = mps_jobs
        self._jobdir = jobdir
        self._waiting = waiting
        #: a job's elastic memory (suspended, host bytes, burst), as of the queue loop's tick
        self.elastic = elastic
        self.context_reserve = context_reserve
        #: the simulated node's directory (None on real GPUs): `gpupool gpus` opens it from here
        self.node_dir = node_dir
        self._target_workload = target_workload
        #: each finished job's listing entry, encoded: (its owner, as its owner and the admins
        #: see it, as others see it: no command)
        self._listed: dict[int, tuple[int, bytes, bytes]] = {}
        #: the node's services (set by the agent): their listings and traffic
        self.services: ServiceManager | None = None

    @property
    def simulated(self) -> bool:
        """A simulated node: announced in /v1/node and the dashboard, never hidden."""
        return self.node_dir is not None

    # -- settings -----------------------------------------------------------------------------

    @property
    def access(self) -> Access:
        """Who may see and act on whose jobs."""
        return self._config.access

    @property
    def policy(self) -> str:
        return self._config.policy

    @property
    def watchdog_action(self) -> Action:
        return self._watchdog.action

    @property
    def draining(self) -> bool:
        return self._store.setting("draining") == "1"

    # -- jobs ---------------------------------------------------------------------------------

    def job(self, job_id: int) -> Job:
        return self._with_mig([self._store.job(job_id)])[0]

    def owner(self, job_id: int) -> int:
        """The uid of the job's owner (NotFound: no such job)."""
        return self._store.job(job_id).uid

    def jobs(self, everything: bool = False) -> list[Job]:
        """Jobs by id (queued and running ones, or all)."""
        states = None if everything else [State.QUEUED, State.RUNNING]
        return self._with_mig(sorted(self._store.jobs(states), key=lambda job: job.id))

    def open_jobs(self) -> list[Job]:
        """Queued and running jobs in queue order, without their MIG instances (for /metrics)."""
        return self._store.jobs([State.QUEUED, State.RUNNING])

    def _with_mig(self, jobs: list[Job]) -> list[Job]:
        """`jobs` with the MIG instance each MIG job holds."""
        uses = self._store.mig_uses(released=True)
        return [replace(job, mig=uses.get(job.id)) if job.id in uses else job for job in jobs]

    def live(self, job_id: int) -> Usage | None:
        """The job's GPU memory and utilisation at the last sample."""
        return self._sampler.live(job_id)

    def over_share(self, job_id: int) -> bool:
        """Whether the watchdog has seen the job over its memory share."""
        return job_id in self._watchdog.flagged

    def job_json(self, job: Job) -> dict[str, Any]:
        """The job as listed: its record, live usage, the watchdog's mark, its MPS server."""
        data = job.to_json()
        live = self.live(job.id)
        data["live_memory"] = live.memory if live else None
        data["utilization"] = live.utilization if live else None
        data["over_share"] = self.over_share(job.id)
        data["mps_server"] = self.mps_server(job)
        data["elastic"] = self.elastic(job.id)
        return data

    def jobs_json(self, everything: bool, may_see: Callable[[int], bool]) -> bytes:
        """`{"jobs": [job_json(job), ...]}` by id (queued and running jobs, or all), as JSON; a
        job whose owner's uid `may_see` refuses is listed without its command. A finished job
        never changes, so its entries are encoded once and kept until the job is pruned:
        `ps --all` on a node with 10,000 finished jobs then costs the open jobs, not the 10,000
        (bench/ps_latency.py)."""
        if everything:
            ids, read = self._store.listing(self._listed)
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
                entry = _listing_entry(job.uid, self.job_json(job))
                if finished and len(entry[1]) <= MAX_LISTED_BYTES:
                    self._listed[job_id] = entry
            owner, full, hidden = entry
            parts.append(full if may_see(owner) else hidden)
        return b'{"jobs":[' + b",".join(parts) + b"]}"

    def keep_listed(self, job_ids: set[int]) -> None:
        """After a prune: the kept listing entries of jobs the store no longer holds go, those a
        listing that read them before the prune kept after it too."""
        for job_id in [i for i in self._listed if i not in job_ids]:
            self._listed.pop(job_id, None)

    def describe(self, job_id: int) -> dict[str, Any]:
        """The job's record, its events, and why it waits if it is queued."""
        job = self.job(job_id)
        data = job.to_json()
        data["events"] = self._store.events(job_id)
        data["elastic"] = self.elastic(job_id)
        data["waiting"] = list(self._waiting(job_id)) if job.state is State.QUEUED else []
        if self.context_reserve and any(" memory " in line for line in data["waiting"]):
            data["waiting"].append(
                f"(free memory is net of {format_bytes(self.context_reserve)} per job and GPU "
                "for CUDA contexts: gpupool serve --context-reserve)"
            )
        if job.state is State.QUEUED and self.draining:
            data["waiting"].insert(0, "the node is draining: nothing new starts")
        return data

    def mps_server(self, job: Job) -> int | None:
        """The pid of the MPS server the job's processes use (None: not an mps job, or none)."""
        return self._mps_jobs.server_pid(job)

    def read_log(self, job_id: int, stream: str, offset: int, limit: int) -> tuple[bytes, int]:
        """Up to `limit` bytes of the job's `stream` log from `offset`, and where they start: at
        the top when the log reached --max-log-size and was cut to its tail since `offset`."""
        jobdir = self._jobdir(job_id)
        start = max(0, offset)
        data = jobdir.read_log(stream, start, limit)
        if not data and start and jobdir.log_size(stream) < start:
            start = 0
            data = jobdir.read_log(stream, start, limit)
        return data, start

    def shared_region(self, job_id: int) -> Path | None:
        """The job's accounting region (None: an exclusive job, or not launched yet)."""
        return find_shared_region(self._jobdir(job_id).path)

    # -- events and the watchdog --------------------------------------------------------------

    def watchdog_events(self, since: float, limit: int) -> list[dict[str, Any]]:
        """The watchdog's events (node events and jobs' events of its kinds), the newest `limit`
        at or after `since`, oldest first: {at, job_id, kind, detail, ...}."""
        return self._store.node_events(KINDS, since, limit)

    def recent_events(self, limit: int) -> list[dict[str, Any]]:
        """The last `limit` events of the jobs and the last `limit` of the node, merged, newest
        first: {at, job_id, kind, detail}, job_id None for an event of the node."""
        merged = self._store.recent_events(limit) + self._store.node_events((), limit=limit)
        return sorted(merged, key=lambda event: event["at"], reverse=True)

    def processes(self) -> list[GpuProcess]:
        """Every GPU process of the watchdog's last pass, with its job and share."""
        return self._watchdog.processes

    # -- the node -----------------------------------------------------------------------------

    def node_json(self) -> dict[str, Any]:
        """Each GPU's admitted memory and compute and its jobs, and the node's settings."""
        running = self._store.jobs([State.RUNNING])
        # a suspended job's memory is free (elastic memory): admission counts it so
        running = [j for j in running if (self.elastic(j.id) or {}).get("state") != "suspended"]
        capacity = self._sampler.capacity
        reserve = self.context_reserve
        free = node.free_now(capacity, running, reserve)
        gpus = []
        for cap, now in zip(capacity, free, strict=True):
            # shares and their context reserves, summed (free room clips at zero)
            admitted = sum(
                node.held(job.spec, memory, reserve)
                for job in running
                for index, memory in zip(job.gpus, job.memory, strict=False)
                if index == cap.index
            )
            gpus.append(
                {
                    "index": cap.index,
                    "model": cap.model,
                    "healthy": cap.healthy,
                    "memory_total": cap.memory_total + reserve if cap.memory_total else 0,
                    "memory_admitted": admitted,
                    "compute_admitted": 1000 - now.compute_free,
                    "jobs": [j.id for j in running if cap.index in j.gpus],
                    "mps": self._mps_jobs.of_gpu(cap.index, running),
                }
            )
        return {
            "policy": self.policy,
            "target_workload": self._target_workload(),
            "draining": self.draining,
            "simulated": self.simulated,
            "node_dir": None if self.node_dir is None else str(self.node_dir),
            "context_reserve": reserve,
            "gpus": gpus,
        }

    # -- observations (the sampler's and the queue loop's) ------------------------------------

    def snapshot(self) -> NodeSnapshot | None:
        """The last GPU snapshot."""
        return self._observed.snapshot

    def usage_per_gpu(self) -> Mapping[tuple[int, int], Usage]:
        """Memory and utilisation per (job id, GPU index) at the last sample."""
        return self._observed.per_gpu

    def history(self) -> list[HistoryPoint]:
        """Recent utilisation per GPU, oldest first."""
        return self._observed.recent()

    def queue_wait(self) -> HistogramReading:
        """Time from submission to start of the jobs this daemon started."""
        return self._observed.queue_wait.read()

    def scheduling_latency(self) -> HistogramReading:
        """Time of each scheduling decision over a non-empty queue."""
        return self._observed.scheduling.read()


def _listing_entry(owner: int, data: dict[str, Any]) -> tuple[int, bytes, bytes]:
    """A job's listing entry as its owner sees it and as others do (no command). ASCII
    (escaped) JSON: no stored string can make the answer unencodable."""
    full = json.dumps(data).encode()
    hidden = json.dumps({**data, "command": None}).encode()
    return owner, full, hidden
