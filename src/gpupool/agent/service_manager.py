"""The daemon's services: create, scale, update, delete; their loop is service_loop.py.

Each replica is a job submitted through the agent's `submit` (the queue's admission and the
placement engine decide where it runs, as for any job). The manager keeps the services in
memory and writes each change through service_store.py; its base class, `ServiceLoop`, keeps
their replicas up.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from gpupool.agent.access import Access
from gpupool.agent.autoscale import Autoscaler
from gpupool.agent.jobs import JobSpec
from gpupool.agent.service_loop import Cancel, ServiceLoop, Submit, Waiting
from gpupool.agent.service_parking import Parking
from gpupool.agent.service_replicas import Replica, Service
from gpupool.agent.service_store import ServiceStore, StoredService
from gpupool.agent.service_swap import Swapper
from gpupool.agent.service_traffic import Traffic
from gpupool.agent.services import RESERVED_NAMES, ServiceSpec
from gpupool.agent.store import Store
from gpupool.core.errors import GpupoolError, InvalidRequest, NotFound, PermissionDenied

#: seconds a restarted daemon waits for its adopted replicas' first health checks before it
#: sends the router its table (settled())
SETTLE_S = 10.0


class ServiceManager(ServiceLoop):
    """Every service of the node; thread-safe (one lock over the services)."""

    def __init__(
        self,
        store: Store,
        submit: Submit,
        cancel: Cancel,
        check_fits: Callable[[JobSpec], None],
        waiting: Waiting,
        access: Access,
        parking: Parking,
    ) -> None:
        self._jobs = store
        self._rows = ServiceStore(store)
        self._submit = submit
        self._cancel = cancel
        self._check_fits = check_fits
        self._waiting = waiting
        self._access = access
        self._parking = parking
        self._swapper = Swapper()
        self.traffic = Traffic()
        self._services: dict[str, Service] = {}
        #: replicas of deleted services, drained and stopped by the loop
        self._orphans: list[Replica] = []
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._checks = ThreadPoolExecutor(8, thread_name_prefix="gpupool-health")
        self._adopted: list[Replica] = []
        self._settle_by = 0.0
        self.traffic.on_wait = lambda _name: self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Load the stored services, adopt their replicas, and run the loop."""
        services, replicas = self._rows.load()
        now = time.monotonic()
        for stored in services:
            self._services[stored.spec.name] = self._service(stored, now)
        for row in replicas:
            replica = Replica(row.job_id, row.index, row.port, row.generation, now)
            with contextlib.suppress(GpupoolError):  # the store is busy: it is adopted as running
                replica.state = self._parking.adopted(row.job_id) or replica.state
            owner = self._services.get(row.service)
            if owner is None:
                replica.stopping = "its service was deleted"
                self._orphans.append(replica)
            else:
                owner.replicas[row.job_id] = replica
                owner.event(f"replica {row.index} (job {row.job_id}) adopted by a restarted daemon")
                if replica.state == "suspended":  # it stays parked until a request comes
                    owner.since = now - owner.spec.resident_s
        self._adopted = [r for s in self._services.values() for r in s.replicas.values()]
        self._settle_by = now + SETTLE_S
        self._thread = threading.Thread(target=self._loop, name="gpupool-services", daemon=True)
        self._thread.start()

    def settled(self) -> bool:
        """Whether every replica adopted at start has been seen again (ready, parked, ended or
        stopping), or SETTLE_S have passed: until then the router keeps serving with the last
        daemon's table rather than with one that lacks them."""
        if time.monotonic() > self._settle_by:
            return True
        with self._lock:
            live = {r.job_id for s in self._services.values() for r in s.replicas.values()}
            return not any(
                r.job_id in live and r.stopping is None and r.state in ("queued", "starting")
                for r in self._adopted
            )

    def stop(self) -> None:
        self._stop_event.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._checks.shutdown(wait=False, cancel_futures=True)

    def _service(self, stored: StoredService, now: float) -> Service:
        traffic = self.traffic.add(stored.spec.name, stored.uid, stored.spec.concurrency)
        traffic.models, traffic.user = stored.spec.model_names, stored.user
        traffic.created = stored.created_at
        return Service(stored, traffic, Autoscaler(now), since=now)

    # -- commands --------------------------------------------------------------------------

    def create(self, spec: ServiceSpec, uid: int, user: str) -> dict[str, Any]:
        if spec.name in RESERVED_NAMES:
            raise InvalidRequest(
                f"invalid service name {spec.name}: /{spec.name}/ is the router's OpenAI API"
            )
        self._check_fits(spec.replica(0))
        with self._lock:
            self._check_models_free(spec)
            stored = self._rows.add(spec, uid, user)
            service = self._service(stored, time.monotonic())
            service.event(f"created by {user}")
            self._services[spec.name] = service
        self._wake.set()
        return service.summary()

    def _check_models_free(self, spec: ServiceSpec) -> None:
        """InvalidRequest if another service answers for one of `spec`'s model names: a
        request's `model` routes to one service."""
        for other in self._services.values():
            if other.name == spec.name:
                continue
            taken = sorted(set(other.spec.model_names) & set(spec.model_names))
            if taken:
                raise InvalidRequest(
                    f"model {taken[0][:60]!r} is already served by service {other.name}: "
                    "each model name routes to one service (give another --model)"
                )

    def get(self, name: str) -> Service:
        found = self._services.get(name)
        if found is None:
            raise NotFound(f"no service {name[:60]!r} (gpupool service ls lists them)")
        return found

    def _owned(self, name: str, uid: int, what: str) -> Service:
        """The service `name`, if `uid` owns it or is an admin (else PermissionDenied)."""
        service = self.get(name)
        if not self._access.may_see(uid, service.stored.uid):
            raise PermissionDenied(
                f"service {name} belongs to {service.stored.user}: only they or an admin may {what}"
            )
        return service

    def scale(self, name: str, low: int, high: int, uid: int) -> dict[str, Any]:
        with self._lock:
            service = self._owned(name, uid, "scale it")
            spec = service.spec.scaled(low, high)
            self._rows.update(spec, service.stored.generation)
            service.stored = replace(service.stored, spec=spec)
            service.event(f"replicas {low}..{high}")
        self._wake.set()
        return service.summary()

    def update(self, name: str, spec: ServiceSpec, uid: int) -> dict[str, Any]:
        """A new spec: its replicas are replaced one at a time (a new one ready before an old
        one stops)."""
        with self._lock:
            service = self._owned(name, uid, "update it")
            self._check_fits(spec.replica(0))
            self._check_models_free(spec)
            generation = service.stored.generation + 1
            self._rows.update(spec, generation)
            service.stored = replace(service.stored, spec=spec, generation=generation)
            service.traffic.concurrency = spec.concurrency
            service.traffic.models = spec.model_names
            service.failures, service.retry_at, service.problem = 0, 0.0, ""
            service.event(f"updated to generation {generation}: rolling its replicas")
        self._wake.set()
        return service.summary()

    def delete(self, name: str, uid: int) -> dict[str, Any]:
        with self._lock:
            service = self._owned(name, uid, "delete it")
            self._rows.delete(name)
            del self._services[name]
            self.traffic.remove(name)
            for replica in service.replicas.values():
                replica.stopping = replica.stopping or "its service was deleted"
                replica.drain_since = replica.drain_since or time.monotonic()
                self._orphans.append(replica)
        self._wake.set()
        return service.summary()

    # -- reads -----------------------------------------------------------------------------

    def services(self) -> list[Service]:
        with self._lock:
            return sorted(self._services.values(), key=lambda s: s.name)

    def describe(self, name: str, may_see: Callable[[int], bool]) -> dict[str, Any]:
        with self._lock:
            return self.get(name).describe(may_see)
