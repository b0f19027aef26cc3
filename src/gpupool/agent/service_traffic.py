"""Each service's replicas and traffic: the table between the router and the service manager.

Two copies, one per process, kept in step by the control channel (api/router_messages.py). In
the daemon the manager (its own thread) publishes each service's endpoints, replacing the tuple
whole, and marks one draining before it stops it; the counters are a mirror of the router's,
written by the channel's thread alone and read by the manager, /metrics and the listings (under
the GIL a reader sees a whole value, and a count read a moment late is all the autoscaler
needs). In the router process the table is the daemon's last one, and the router's event loop
counts the requests in flight on each endpoint, the requests waiting, each answer's status and
latency.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.agent.observe import Histogram

#: seconds: from a token's first byte (milliseconds) to a long generation (a minute)
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(eq=False)
class Endpoint:
    """One ready replica as the router sees it."""

    job_id: int
    index: int
    port: int
    generation: int
    #: requests sent to it and not yet answered in full (the router's)
    in_flight: int = 0
    #: no new requests: it is being stopped once those in flight are answered (the manager's)
    draining: bool = False
    #: it refused a connection: no new requests until a health check passes after it (the
    #: router's; the daemon's copy is what the router last reported)
    broken: bool = False
    #: time.monotonic() when it was found broken (the router's)
    broken_at: float = 0.0
    #: time.monotonic() of its last passing health check (the manager's)
    healthy_at: float = 0.0

    def refused(self) -> None:
        """The router could not reach it: the others take its requests until it is back."""
        self.broken, self.broken_at = True, time.monotonic()


@dataclass(eq=False)
class ServiceTraffic:
    """One service's endpoints and counters."""

    name: str
    owner: int
    concurrency: int
    endpoints: tuple[Endpoint, ...] = ()
    in_flight: int = 0
    queued: int = 0
    #: answers by HTTP status; 502: the replica failed mid-request; 503: the wait queue was
    #: full or no replica came in time
    statuses: Counter[int] = field(default_factory=Counter)
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    #: time.monotonic() of the last request's arrival (0: none yet)
    last_request: float = 0.0
    #: the service was deleted: waiting requests get 404, new ones too
    gone: bool = False
    #: the model names a request to the OpenAI API routes to it by, its owner's name, and
    #: when it was created (time.time()): what GET /v1/models lists
    models: tuple[str, ...] = ()
    user: str = ""
    created: float = 0.0

    @property
    def requests_total(self) -> int:
        return sum(self.statuses.values())

    def load(self) -> int:
        """What the autoscaler follows: requests in flight plus those waiting for a replica."""
        return self.in_flight + self.queued


class Traffic:
    """Every service's traffic, by name; `changed()` tells the router to look again."""

    def __init__(self) -> None:
        self._services: dict[str, ServiceTraffic] = {}
        self._lock = threading.Lock()
        #: set by the router: called (from any thread) when endpoints change
        self.on_change: Callable[[], None] | None = None
        #: set by the manager: a request waits for a replica of this service
        self.on_wait: Callable[[str], None] | None = None

    def get(self, name: str) -> ServiceTraffic | None:
        return self._services.get(name)

    def by_model(self, model: str) -> ServiceTraffic | None:
        """The service that answers for `model` (one at most: the manager refuses a second)."""
        for service in list(self._services.values()):
            if model in service.models:
                return service
        return None

    def all(self) -> list[ServiceTraffic]:
        return list(self._services.values())

    def add(self, name: str, owner: int, concurrency: int) -> ServiceTraffic:
        with self._lock:
            found = self._services.get(name)
            if found is None or found.gone:
                found = ServiceTraffic(name, owner, concurrency)
                self._services[name] = found
            found.concurrency = concurrency
        return found

    def remove(self, name: str) -> None:
        with self._lock:
            found = self._services.pop(name, None)
        if found is not None:
            found.gone = True
            found.endpoints = ()
        self.changed()

    def publish(self, name: str, endpoints: tuple[Endpoint, ...]) -> None:
        found = self._services.get(name)
        if found is not None and found.endpoints != endpoints:
            found.endpoints = endpoints
            self.changed()

    def changed(self) -> None:
        notify = self.on_change
        if notify is not None:
            notify()

    def waiting(self, name: str) -> None:
        """A request found no room: the manager wakes at once (a scale from zero starts now)."""
        service = self._services.get(name)
        if service is not None:
            service.last_request = time.monotonic()
        wake = self.on_wait
        if wake is not None:
            wake(name)
