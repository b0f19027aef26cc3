"""Parking: the last replica of a service scaled to zero is suspended to host memory rather than
cancelled, and the next request resumes it (a copy back rather than a cold start).

A replica parks in steps, one per pass of the service loop: `parking` (the router sends it no new
request; those in flight are answered), `suspending` (asked), `suspended` (elastic memory has
moved its GPU memory to the host: the GPU is free for others), then, woken by a request,
`resuming` (it waits for its GPUs to have room for its share again: service_swap.py parks other
services' idle replicas for it), and `starting` once its memory is back (health-checked like a
new replica, ready when it answers). When it cannot come back (elastic memory refuses, its GPUs
have no room and no swap can make it, its job ended), it is stopped and a new replica starts, as
without parking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpupool.agent.service_replicas import PARKED, Replica, Service
from gpupool.agent.services import DEFAULT_DRAIN_S
from gpupool.core.errors import GpupoolError

#: seconds a parking replica's requests in flight have been waited for, at least (the router
#: may have picked it just before: that request counts in flight within a moment)
MIN_PARK_DRAIN_S = 0.5
#: the same for a replica swapped out for another service's request: idle for 0.5 s already,
#: two of the router's reports of what it has in flight (every 0.1 s) are waited for
SWAP_DRAIN_S = 0.2
#: seconds between the service loop's passes while a replica resumes (a request waits for it)
RESUMING_TICK_S = 0.02
#: how `_stop` is called: service, replica, why, now
Stop = Callable[[Service, Replica, str, float], None]


@dataclass(frozen=True)
class Parking:
    """What parking needs of the agent's elastic memory, for a job id: suspend it, resume it,
    its state ("" when it runs, suspending, suspended, resuming; and why a resume waits for
    room, "" if it does not), the bytes it holds, and whether it has room to come back; and
    the bound on parked bytes."""

    suspend: Callable[[int], object]
    resume: Callable[[int], object]
    state: Callable[[int], tuple[str, str]]
    #: the bytes a job's memory takes, on its GPUs or in host memory
    holds: Callable[[int], int] = lambda _job_id: 0
    #: the host bytes parked replicas may hold together (service_swap.bound_host)
    host_limit: int = 1 << 62
    #: whether a suspended job's GPUs have room for it to come back at once (the headroom
    #: service_swap.Swapper.keep_room keeps)
    room_back: Callable[[int], bool] = lambda _job_id: True

    def adopted(self, job_id: int) -> str | None:
        """The state of a replica adopted by a restarted daemon, if it was parked."""
        state, _ = self.state(job_id)
        return state or None

    def park(self, service: Service, replica: Replica, now: float) -> None:
        """Start parking a ready replica: no new requests."""
        replica.state, replica.drain_since = "parking", now
        if replica.endpoint is not None:
            replica.endpoint.draining = True
        why = "scaled to zero"
        if service.swapped_out():  # for another service's request (service_swap.py)
            replica.swapping_out, why = True, "swapped out"
        service.event(
            f"replica {replica.index} (job {replica.job_id}) parking: {why}, "
            "it is suspended to host memory once its requests are answered"
        )

    def wake(self, service: Service, replica: Replica, now: float, stop: Stop) -> bool:
        """A request wants the parked `replica`: whether it comes back (else it is stopped and
        the caller starts a new replica)."""
        label = f"replica {replica.index} (job {replica.job_id})"
        replica.swapping_out = False
        if replica.state == "parking":  # still answering: it serves again at once
            replica.state = "ready"
            if replica.endpoint is not None:
                replica.endpoint.draining = False
            service.event(f"{label} kept: a request came while it was parking")
            return True
        try:
            self.resume(replica.job_id)
        except GpupoolError as err:
            stop(service, replica, f"could not be resumed ({err}): a new replica instead", now)
            return False
        replica.state, replica.started, replica.woken_at = "resuming", now, now
        service.event(f"{label} resuming from host memory for a request")
        return True

    def ended(self, service: Service, replica: Replica, how: str) -> bool:
        """Whether the ended `replica` was parked: no failure of the service's then (nothing
        was serving), the next request starts a new replica."""
        if replica.stopping is not None or replica.state not in PARKED:
            return False
        label = f"replica {replica.index} (job {replica.job_id})"
        service.event(f"{label} {how} while {replica.state}: the next request starts a new one")
        return True

    def settle(self, service: Service, now: float, stop: Stop) -> None:
        """Move each parked replica on a step, as far as its job has come."""
        for replica in list(service.replicas.values()):
            if replica.stopping is not None:
                continue
            if replica.state == "parking":
                self._suspend_drained(service, replica, now, stop)
            elif replica.state in ("suspending", "suspended", "resuming"):
                self._follow(service, replica, now, stop)

    def _suspend_drained(self, service: Service, replica: Replica, now: float, stop: Stop) -> None:
        busy = replica.endpoint is not None and replica.endpoint.in_flight > 0
        waited = now - replica.drain_since
        # swapped out, it had no request for service_swap.MIN_IDLE_S: a shorter wait will do
        least = SWAP_DRAIN_S if service.swapped_out() else MIN_PARK_DRAIN_S
        if waited < least or (busy and waited < DEFAULT_DRAIN_S):
            return
        try:
            self.suspend(replica.job_id)
        except GpupoolError as err:  # it holds no memory yet, it ended: stopped as before
            stop(service, replica, f"scaled to zero (not suspended: {err})", now)
            return
        replica.state, replica.endpoint = "suspending", None
        if replica.swapping_out:  # counted once its memory moves (not if it was kept)
            service.swaps_out += 1

    def _follow(self, service: Service, replica: Replica, now: float, stop: Stop) -> None:
        state, waits = self.state(replica.job_id)
        label = f"replica {replica.index} (job {replica.job_id})"
        if not state:  # its memory is back (or its owner resumed it): health-checked, then ready
            replica.state, replica.started, replica.resumed = "starting", now, True
            replica.waits = ""
            service.event(f"{label} resumed: its memory is back, checking its health")
        elif replica.state == "suspending" and state == "suspended":
            replica.state = "suspended"
            service.event(f"{label} suspended to host memory: the next request resumes it")
        elif replica.state == "resuming":
            # no room yet: the swap parks other services' idle replicas, or stops this one
            replica.waits = waits

    def ready(self, service: Service, replica: Replica, now: float) -> None:
        """A replica passed its first health check: if it came back from host memory for a
        request, that was a swap in, and how long it took is counted."""
        if not (replica.resumed and replica.woken_at):
            return
        took = now - replica.woken_at
        service.swaps_in += 1
        service.swap_in_s.observe(took)
        service.last_swap_in_s = round(took, 3)
        replica.woken_at = 0.0
        service.event(f"replica {replica.index} (job {replica.job_id}) swapped in in {took:.2f}s")
