"""Which processes ask the compute arbiter for their GPU's time: the watchdog's measure of a
compute escape (a process of an arbitrated job that uses a GPU without asking for its lease)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.agent.arbiters import NodeArbiter
from gpupool.agent.jobs import Job
from gpupool.agent.launcher import arbiter_limits
from gpupool.core.errors import GpupoolError
from gpupool.isolation.arbiter import LeaseClient, lease_clients, view_file
from gpupool.isolation.node import LaunchNode

#: after the arbiter (re)started, its shares' processes rejoin within about a second: until
#: then a share's process holds its cap alone, no escape
REJOIN_GRACE_S = 3.0


@dataclass(frozen=True)
class Leases:
    """Per (GPU index, job id) of an arbitrated job: the pids the arbiter knows for its share."""

    clients: Mapping[tuple[int, int], frozenset[int]] = field(default_factory=dict)

    def escaped(self, gpu: int, job_id: int, pid: int) -> bool:
        """Whether `pid` of job `job_id` has no say at the arbiter for GPU `gpu`."""
        known = self.clients.get((gpu, job_id))
        return known is not None and pid not in known


def held_leases(arbiter: NodeArbiter, jobs: Sequence[Job], node: LaunchNode) -> Leases | None:
    """The arbitrated jobs' lease clients, from the arbiter's views; None while the arbiter is
    away or just back (nothing can be told then)."""
    if not arbiter.up_for(REJOIN_GRACE_S, time.monotonic()):
        return None
    views: dict[str, list[LeaseClient]] = {}
    clients: dict[tuple[int, int], frozenset[int]] = {}
    for job in jobs:
        limits = arbiter_limits(job)
        if limits is None or not limits.arbitrated:
            continue
        share_id = arbiter.share_of(f"job {job.id}").share_id
        for gpu in limits.gpus:
            uuid = limits.mig_uuid or node.uuids[gpu]
            try:
                found = views.setdefault(uuid, lease_clients(view_file(arbiter.directory, uuid)))
            except GpupoolError:
                return None  # not the arbiter's view: nothing to go by
            clients[(gpu, job.id)] = frozenset(c.pid for c in found if c.share_id == share_id)
    return Leases(clients)
