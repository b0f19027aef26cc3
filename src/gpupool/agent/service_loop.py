"""The service manager's loop: keeps each service's replicas up, healthy, scaled and rolled.

The loop, its own thread, passes over every service a few times a second: it records replicas
that ended (a failure is restarted after a backoff that doubles, up to 30 s), health-checks the
rest (a replica that never answers within its ready timeout, or stops answering, is stopped and
counted as a failure), asks the autoscaler how many replicas the service wants, starts or drains
replicas to match, and rolls an updated service one new replica at a time: an old one is drained
only once a new one is ready. Every replica stops through `_stop`: the router stops sending it
requests, and it is cancelled once those in flight are answered (or after DEFAULT_DRAIN_S). The
one exception is the last replica of a service (mode shim) scaled to zero: it is parked
(service_parking.py), suspended to host memory, and the next request resumes it rather than
starting a new one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

from gpupool.agent import service_health, service_swap
from gpupool.agent.access import Access
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.logs import Failures
from gpupool.agent.service_parking import RESUMING_TICK_S, Parking
from gpupool.agent.service_replicas import (
    HEALTH_EVERY_S,
    HEALTH_FAILURES,
    Replica,
    Service,
    backoff,
    how_it_ended,
)
from gpupool.agent.service_store import ServiceStore, StoredReplica
from gpupool.agent.service_traffic import Endpoint, Traffic
from gpupool.agent.services import DEFAULT_DRAIN_S
from gpupool.agent.store import Store
from gpupool.core.errors import GpupoolError, NotFound
from gpupool.core.resources import Mode

TICK_S = 0.2
MIN_DRAIN_S = 0.5
#: how long one pass waits for a service's health checks before going on without them
CHECK_WAIT_S = 0.05
#: what the manager needs of the agent: submit a job, cancel one, check a share could ever fit
Submit = Callable[[JobSpec, int, str], Job]
Cancel = Callable[[int, int, str], Job]
Waiting = Callable[[int], tuple[str, ...]]


class ServiceLoop:
    """The loop's half of the `ServiceManager`, which sets every part below in its constructor."""

    _jobs: Store
    _rows: ServiceStore
    _submit: Submit
    _cancel: Cancel
    _waiting: Waiting
    _access: Access
    _parking: Parking
    _swapper: service_swap.Swapper
    traffic: Traffic
    _services: dict[str, Service]
    _orphans: list[Replica]
    _lock: threading.RLock
    _wake: threading.Event
    _stop_event: threading.Event
    _checks: ThreadPoolExecutor

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = Failures("the service loop", TICK_S)
        while not self._stop_event.is_set():
            try:
                self.reconcile()
                # a replica resuming for a held request is followed closely: a wake's latency
                wait = RESUMING_TICK_S if self._resuming() else TICK_S
                failures.succeeded()
            except Exception as err:  # a busy store, a bug: the services go on
                wait = failures.failed(err)
            self._wake.wait(wait)
            self._wake.clear()

    def _resuming(self) -> bool:
        with self._lock:
            return any(r.resuming() for s in self._services.values() for r in s.replicas.values())

    def reconcile(self) -> None:
        """One pass over every service (and the replicas of deleted ones)."""
        with self._lock:
            services = list(self._services.values())
        for service in services:
            with self._lock:
                try:
                    self._pass(service)
                except GpupoolError as err:
                    service.problem = str(err)
        with self._lock:
            now = time.monotonic()
            parking = self._parking
            service_swap.bound_host(services, parking.host_limit, parking.holds, now, self._stop)
            self._swapper.make_room(services, now, self._stop)
            self._swapper.keep_room(services, now, parking.room_back)
        self._stop_orphans()

    def _pass(self, service: Service) -> None:
        now = time.monotonic()
        self._refresh(service, now)
        self._parking.settle(service, now, self._stop)
        self._check_health(service, now)
        traffic = service.traffic
        last = max(traffic.last_request, service.since)
        if service.swapped_out():
            decision = service.scaler.swapped_out(now, "swapped out for another service's request")
        else:
            decision = service.scaler.decide(
                service.spec, traffic.load(), traffic.queued, last, now
            )
        if decision.replicas != service.desired:
            service.event(f"desired {service.desired} -> {decision.replicas}: {decision.why}")
        service.desired, service.why = decision.replicas, decision.why
        self._converge(service, now)
        self._drain(service, now)
        endpoints = tuple(r.endpoint for r in service.ready() if r.endpoint is not None)
        self.traffic.publish(service.name, endpoints)

    def _refresh(self, service: Service, now: float) -> None:
        """Record the replicas whose job ended; note where the others are."""
        for replica in list(service.replicas.values()):
            try:
                job = self._jobs.job(replica.job_id)
            except NotFound:  # pruned by an admin meanwhile
                job = None
            if job is None or job.state.finished:
                self._ended(service, replica, job, now)
                continue
            replica.gpus = job.gpus
            if job.state is State.QUEUED:
                replica.note = "; ".join(self._waiting(job.id)) or "queued"
            elif replica.state == "queued" and job.job_pid is not None:
                replica.state, replica.started, replica.note = "starting", now, ""

    def _ended(self, service: Service, replica: Replica, job: Job | None, now: float) -> None:
        del service.replicas[replica.job_id]
        service.ended[replica.index] = replica.job_id
        self._rows.drop_replica(replica.job_id)
        if replica.endpoint is not None:
            replica.endpoint.draining = True
        how = how_it_ended(job, self._jobs.events(job.id)) if job else "vanished"
        if self._parking.ended(service, replica, how):
            return
        if replica.stopping is not None and not replica.stopping.startswith("failed"):
            service.event(f"replica {replica.index} (job {replica.job_id}) stopped")
            return
        how = replica.stopping or how
        service.failures += 1
        service.restarts += 1
        wait = backoff(service.failures)
        service.retry_at = now + wait
        service.problem = (
            f"replica {replica.index} (job {replica.job_id}) {how}; "
            f"{service.failures} failure(s) in a row, next start in {wait:g}s "
            f"(gpupool service logs {service.name} --replica {replica.index})"
        )
        service.event(service.problem)

    def _check_health(self, service: Service, now: float) -> None:
        """Start the checks that are due; take the results of those done. A check runs in the
        pool and is waited for CHECK_WAIT_S at most: a replica that holds its health check
        open (up to HEALTH_TIMEOUT_S) slows no pass, no other service, no API call."""
        spec, owner = service.spec, service.stored.uid
        for replica in service.replicas.values():
            due = replica.state == "starting" or now - replica.checked >= HEALTH_EVERY_S
            serving = replica.state in ("starting", "ready") and replica.stopping is None
            if serving and due and replica.check is None:
                replica.check = self._checks.submit(
                    service_health.check, replica.port, spec.health, owner
                )
        pending = [r.check for r in service.replicas.values() if r.check is not None]
        if pending:
            futures.wait(pending, timeout=CHECK_WAIT_S)
        for replica in list(service.replicas.values()):
            check = replica.check
            if check is None or not check.done():
                continue
            replica.check = None
            if replica.stopping is not None:
                continue
            failure = check.result()
            replica.checked = now
            if failure is None:
                replica.health_failures, replica.note = 0, ""
                if replica.endpoint is not None:
                    replica.endpoint.healthy_at = now  # the router takes it back if broken
                if replica.state == "starting":
                    self._parking.ready(service, replica, now)
                    replica.state = "ready"
                    replica.endpoint = Endpoint(
                        replica.job_id, replica.index, replica.port, replica.generation
                    )
                    service.failures, service.problem = 0, ""
                    took = now - replica.created
                    service.event(
                        f"replica {replica.index} (job {replica.job_id}) ready in {took:.1f}s"
                    )
                continue
            replica.note = failure
            if replica.state == "starting":
                if now - replica.started > spec.ready_timeout_s:
                    self._stop(
                        service,
                        replica,
                        f"failed: never became ready within {spec.ready_timeout_s:g}s "
                        f"(--ready-timeout): {failure}",
                        now,
                    )
                continue
            replica.health_failures += 1
            if replica.health_failures >= HEALTH_FAILURES:
                self._stop(service, replica, f"failed its health check: {failure}", now)

    def _converge(self, service: Service, now: float) -> None:
        """Start or stop replicas toward `desired`, rolling old generations out."""
        generation = service.stored.generation
        parked = service.parked()
        for replica in [r for r in parked if r.generation != generation]:
            self._stop(service, replica, "replaced by a newer generation", now)
        parked = [r for r in parked if r.generation == generation]
        live = service.live()
        old = [r for r in live if r.generation != generation]
        new = [r for r in live if r.generation == generation]
        want = service.desired
        if old:
            new_ready = [r for r in new if r.state == "ready"]
            # one new replica at a time; an old one goes once a new one is ready in its place
            if all(r.state == "ready" for r in new) and len(new) < max(want, 1):
                self._start_replicas(service, 1, now)
            extra = len(old) + len(new_ready) - max(want, 0)
            for replica in sorted(old, key=_stop_order)[: max(0, min(extra, len(new_ready)))]:
                self._stop(service, replica, "replaced by a newer generation", now)
            if want == 0:
                for replica in old:
                    self._stop(service, replica, "scaled to zero", now)
            return
        if len(new) < want:
            missing = want - len(new)
            for replica in parked[:missing]:
                if self._parking.wake(service, replica, now, self._stop):
                    missing -= 1
            self._start_replicas(service, missing, now)
        elif len(new) > want:
            why = "scaled to zero" if want == 0 else f"scaled in to {want}"
            going = sorted(new, key=_stop_order)[: len(new) - want]
            # the last replica of a service scaled to zero is parked (the one kept longest)
            shim = service.spec.mode is Mode.SHIM
            if want == 0 and shim and not parked and going[-1].state == "ready":
                self._parking.park(service, going.pop(), now)
            for replica in going:
                self._stop(service, replica, why, now)

    def _start_replicas(self, service: Service, count: int, now: float) -> None:
        if now < service.retry_at:
            return
        taken = [r.port for s in self._services.values() for r in s.replicas.values()]
        for _ in range(count):
            port = service_health.free_port(taken)
            taken.append(port)
            index = service.next_index()
            spec = service.spec.replica(port, index)
            job = self._submit(spec, service.stored.uid, service.stored.user)
            generation = service.stored.generation
            self._rows.add_replica(StoredReplica(job.id, service.name, index, port, generation))
            service.replicas[job.id] = Replica(job.id, index, port, generation, now)
            service.event(f"replica {index} (job {job.id}) started on port {port}")

    def _stop(self, service: Service | None, replica: Replica, why: str, now: float) -> None:
        """The one place a replica is stopped: no new requests, then cancelled once its
        requests in flight are answered (a parked replica too, when it is stopped)."""
        if replica.stopping is not None:
            return
        replica.stopping, replica.drain_since = why, now
        if replica.endpoint is not None:
            replica.endpoint.draining = True
        if service is not None:
            service.event(f"replica {replica.index} (job {replica.job_id}) stopping: {why}")

    def _drain(self, service: Service, now: float) -> None:
        for replica in service.replicas.values():
            self._cancel_drained(replica, now)

    def _cancel_drained(self, replica: Replica, now: float) -> None:
        if replica.stopping is None or replica.cancelled:
            return
        busy = replica.endpoint is not None and replica.endpoint.in_flight > 0
        # the router may have picked it just before it was marked: that request counts in
        # flight within a moment, so a replica drains for at least MIN_DRAIN_S
        if now - replica.drain_since < MIN_DRAIN_S or (
            busy and now - replica.drain_since < DEFAULT_DRAIN_S
        ):
            return
        replica.cancelled = True
        with contextlib.suppress(GpupoolError):  # it ended meanwhile
            self._cancel(replica.job_id, self._access.daemon_uid, "gpupool (service)")

    def _stop_orphans(self) -> None:
        now = time.monotonic()
        with self._lock:
            for replica in list(self._orphans):
                try:
                    job = self._jobs.job(replica.job_id)
                except NotFound:
                    job = None
                if job is None or job.state.finished:
                    self._orphans.remove(replica)
                    self._rows.drop_replica(replica.job_id)
                    continue
                self._cancel_drained(replica, now)


def _stop_order(replica: Replica) -> tuple[int, int]:
    """Which replicas go first: those not serving yet, then the newest."""
    return (0 if replica.state != "ready" else 1, -replica.index)
