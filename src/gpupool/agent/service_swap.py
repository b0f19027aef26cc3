"""Swap: services whose memory together exceeds their GPUs' share them, as Ollama's models do.

When a service's replica must start (its job waits in the queue for room) or come back from host
memory (its resume waits for room), the idle replicas of other services are parked for it, least
recently used first: such a service is marked swapped out, goes to zero replicas at its next
pass, and its last replica is parked (service_parking.py: suspended to host memory) while the
router holds the waiting request. One service is swapped out at a time for each waiter, and its
next only once the memory of the last is free, so no more is parked than the waiter needs; the
waiters are served in parallel. A swapped-out service
comes back with its next request, swapping out others in turn. A GPU that swaps keeps room for
its next swap in: the least recently used idle service is swapped out in the background (one
such at a time, beside the waiters' own) until the service swapped out most recently used could
come back at once, so that a swap in is one copy (its own in) and not two in series (a victim's
out, then its own in); only where at least KEEP_ROOM_AMONG swappable services are resident.

Only a service that may go to zero can be swapped out: MIN 0, mode shim (its memory can be moved),
not `--keep-alive -1`, and idle (no request in flight or waiting; a resume waits while a service
it may swap out is busy). A resume that has no room and nothing to swap out gives way to a new
replica, as without swap.

The host memory parked replicas hold together is bounded (`gpupool serve --parked-memory`): past
it, the least recently used parked replica is stopped (its service cold-starts a new one at its
next request), before a replica that would go past it moves its memory to the host, so parking
never takes the host's memory from the daemon or a job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from gpupool.agent.service_parking import Stop
from gpupool.agent.service_replicas import PARKED, Replica, Service
from gpupool.core.units import format_bytes

#: states of a replica whose memory is on its way to the host (or gone with its job)
LEAVING = ("ready", "parking", "suspending")
#: seconds the queue and elastic memory have, once a swap's memory is free, to let its waiter
#: in before another service is swapped out for it (what they said before is stale)
SETTLE_S = 0.5
#: seconds without a request before a service counts as idle: the router's counts reach the
#: daemon every 0.1 s, so a service that just answered may still show none in flight
MIN_IDLE_S = 0.5
#: the least number of swappable models resident on a GPU for it to keep room for a swap in:
#: with fewer, the slot left free is too large a part of what stays resident
KEEP_ROOM_AMONG = 3


class Swapper:
    """The service loop's swaps: one service swapped out at a time for each waiting replica
    (waiters in parallel), its next one once the last one's memory is free and settled."""

    def __init__(self) -> None:
        #: waiting replica (job id) -> the service swapped out for it, and when that one's
        #: memory was last seen on its way out
        self._for: dict[int, tuple[str, float]] = {}
        #: the service swapped out last to keep room (keep_room), while its memory leaves
        self._room = ""

    def make_room(self, services: Sequence[Service], now: float, stop: Stop) -> None:
        """For each replica that waits for room, swap out an idle service if none is on its
        way out for it already; a resume with nothing to swap out gives way."""
        by_name = {s.name: s for s in services}
        waiting = list(_waiters(services))
        jobs = {replica.job_id for _, replica in waiting}
        self._for = {job: claim for job, claim in self._for.items() if job in jobs}
        for service, replica in waiting:
            claim = self._for.get(replica.job_id)
            if claim is not None:
                victim = by_name.get(claim[0])
                if victim is not None and _leaving(victim):
                    self._for[replica.job_id] = (claim[0], now)
                    continue
                # its memory came free: the waiter's word may be stale for a moment (a victim
                # taken back by a request of its own before it parked freed nothing)
                freed = victim is None or victim.swapped_out()
                if freed and now - claim[1] < SETTLE_S:
                    continue
            victims = _victims(services, service, replica, now)
            if victims:
                _swap_out(victims[0], service, replica, now)
                self._for[replica.job_id] = (victims[0].name, now)
            elif replica.state == "resuming" and not _candidates(services, service, replica):
                # nothing to swap out, now or once idle: a new replica instead
                why = f"could not resume ({replica.waits}): a new replica instead"
                stop(service, replica, why, now)

    def keep_room(
        self, services: Sequence[Service], now: float, room_back: Callable[[int], bool]
    ) -> None:
        """Headroom on a GPU that swaps: when the service swapped out most recently used has no
        room to come back at once, the least recently used idle one is swapped out now, in the
        background, so that its next request waits for one copy (its own in) rather than two
        in series (a victim's out, then its own in). One such swap out at a time, beside the
        waiters' own: under steady swapping some replica always waits, and the room freed
        first goes to the first waiter, whose own swap out then keeps the room."""
        by_name = {s.name: s for s in services}
        leaving = by_name.get(self._room)
        if leaving is not None and _leaving(leaving):
            return
        parked = [
            (service, replica)
            for service in services
            if service.swapped_out()
            for replica in service.replicas.values()
            if replica.stopping is None and replica.state == "suspended"
        ]
        if not parked:
            return
        service, replica = max(parked, key=lambda item: item[0].traffic.last_request)
        if room_back(replica.job_id):
            return
        if len(_candidates(services, service, replica)) < KEEP_ROOM_AMONG:
            return
        victims = _victims(services, service, replica, now)
        if victims:
            _swap_out(victims[0], service, replica, now, "to keep room for")
            self._room = victims[0].name


def _swap_out(
    victim: Service, waiter: Service, replica: Replica, now: float, why: str = "for"
) -> None:
    victim.swapped_out_at = now
    victim.event(
        f"swapped out {why} service {waiter.name}: parked to host memory, least recently used "
        "first; its next request brings it back"
    )
    if why == "for":
        waiter.event(
            f"replica {replica.index} (job {replica.job_id}) waits for room: swapping out "
            f"service {victim.name}"
        )


def _leaving(service: Service) -> bool:
    """Whether a swapped-out service's memory is still on its way to the host."""
    return service.swapped_out() and any(r.state in LEAVING for r in service.replicas.values())


def _waiters(services: Sequence[Service]) -> Iterator[tuple[Service, Replica]]:
    """Replicas that wait for room: queued jobs the queue has looked at and could not place,
    and resumes without room on their GPUs."""
    for service in services:
        for replica in service.replicas.values():
            if replica.stopping is not None:
                continue
            queued = replica.state == "queued" and replica.note not in ("", "queued")
            if queued or (replica.state == "resuming" and replica.waits):
                yield service, replica


def _victims(
    services: Sequence[Service], waiter: Service, replica: Replica, now: float
) -> list[Service]:
    """Idle services whose memory may go for `replica`, least recently used first."""
    found = [s for s in _candidates(services, waiter, replica) if _idle(s, now)]
    return sorted(found, key=lambda s: (s.traffic.last_request, s.name))


def _candidates(services: Sequence[Service], waiter: Service, replica: Replica) -> list[Service]:
    """Services that may be swapped out for `replica` once idle: swappable, resident (on its
    GPUs when it has some)."""
    found = []
    for service in services:
        if service is waiter or not service.spec.swappable or service.swapped_out():
            continue
        live = [r for r in service.replicas.values() if r.stopping is None]
        gpus = {g for r in live for g in r.gpus}
        if live and not (replica.gpus and not gpus & set(replica.gpus)):
            found.append(service)
    return found


def _idle(service: Service, now: float) -> bool:
    """No request for MIN_IDLE_S, none in flight or waiting, every replica ready (none
    starting or parking)."""
    live = [r for r in service.replicas.values() if r.stopping is None]
    if now - service.traffic.last_request < MIN_IDLE_S or service.traffic.load() > 0:
        return False
    if any(r.state != "ready" for r in live):
        return False
    return not any(r.endpoint is not None and r.endpoint.in_flight for r in live)


def bound_host(
    services: Sequence[Service], limit: int, holds: Callable[[int], int], now: float, stop: Stop
) -> None:
    """Stop parked replicas, least recently used first, until those left hold at most `limit`
    bytes (those parking count with what they will move)."""
    parked = [
        (service, replica, holds(replica.job_id))
        for service in services
        for replica in service.replicas.values()
        if replica.stopping is None and replica.state in PARKED
    ]
    total = sum(size for _, _, size in parked)
    parked.sort(key=lambda item: (item[0].traffic.last_request, item[1].state == "parking"))
    for service, replica, size in parked:
        if total <= limit:
            return
        total -= size
        why = (
            f"evicted to a cold start: parked replicas would hold {format_bytes(total + size)} "
            f"of host memory, past --parked-memory {format_bytes(limit)}"
        )
        stop(service, replica, why, now)
