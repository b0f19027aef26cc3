"""A service and its replicas as the service manager holds them in memory."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gpupool.agent.autoscale import Autoscaler
from gpupool.agent.jobs import Job
from gpupool.agent.logs import about_service
from gpupool.agent.observe import Histogram
from gpupool.agent.service_store import StoredService
from gpupool.agent.service_traffic import Endpoint, ServiceTraffic
from gpupool.agent.services import ServiceSpec

#: events kept per service
MAX_EVENTS = 50
#: seconds between a ready replica's health checks (a starting one is checked at every pass)
HEALTH_EVERY_S = 1.0
#: failed checks in a row after which a ready replica is restarted
HEALTH_FAILURES = 3
#: the longest wait before restarting a failed replica
MAX_BACKOFF_S = 30.0
#: the states of a replica parked by a service scaled to zero (service_parking.py): not serving,
#: and not counted against the replicas the service wants
PARKED = ("parking", "suspending", "suspended")
#: seconds a swap-in takes: a small model's copy back (tens of ms) to a large one's (a minute)
SWAP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def backoff(failures: int) -> float:
    """Seconds before the next start after `failures` failed replicas in a row: 1, 2, 4 .. 30."""
    return float(min(MAX_BACKOFF_S, 2.0 ** max(0, failures - 1)))


@dataclass(eq=False)
class Replica:
    """One replica: its job, port and state as the manager last saw them."""

    job_id: int
    index: int
    port: int
    generation: int
    #: time.monotonic() when it was started (or adopted by a restarted daemon)
    started: float
    #: queued, starting, ready; parking, suspending, suspended, resuming (service_parking.py)
    state: str = "queued"
    gpus: tuple[int, ...] = ()
    endpoint: Endpoint | None = None
    checked: float = 0.0
    health_failures: int = 0
    #: why it is being stopped (None: it is not)
    stopping: str | None = None
    drain_since: float = 0.0
    cancelled: bool = False
    #: its last failed check or why it waits in the queue
    note: str = ""
    #: time.monotonic() when it was submitted (`started` is reset when its process starts)
    created: float = 0.0
    #: it came back from host memory (service_parking.py): followed closely until ready
    resumed: bool = False
    #: its health check under way: None when it passed, else why not
    check: Future[str | None] | None = None
    #: why its resume waits for room ("" if it does not): a swap may free it (service_swap.py)
    waits: str = ""
    #: time.monotonic() when a request woke it from host memory (its swap-in time's start)
    woken_at: float = 0.0
    #: parked for another service's request: a swap out once its memory is out
    swapping_out: bool = False

    def __post_init__(self) -> None:
        self.created = self.created or self.started

    def resuming(self) -> bool:
        """Coming back from host memory for a request (followed closely until ready)."""
        return self.state == "resuming" or (self.state == "starting" and self.resumed)

    def routable(self) -> bool:
        return self.state == "ready" and self.stopping is None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "job_id": self.job_id,
            "state": "draining" if self.stopping is not None else self.state,
            "gpus": list(self.gpus),
            "port": self.port,
            "generation": self.generation,
            "in_flight": self.endpoint.in_flight if self.endpoint is not None else 0,
            "note": self.stopping or self.note,
        }


@dataclass(eq=False)
class Service:
    """A service: its stored spec and owner, its replicas, its traffic and its scaler."""

    stored: StoredService
    traffic: ServiceTraffic
    scaler: Autoscaler
    #: time.monotonic() of its creation (or its adoption): the idle time counts from there
    since: float
    replicas: dict[int, Replica] = field(default_factory=dict)
    desired: int = 0
    why: str = ""
    failures: int = 0
    restarts: int = 0
    retry_at: float = 0.0
    problem: str = ""
    events: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    #: the job of the last replica that ended, by replica index (its logs stay readable)
    ended: dict[int, int] = field(default_factory=dict)
    #: time.monotonic() when it was swapped out for another service's request: it stays at
    #: zero until a request of its own comes after it (service_swap.py)
    swapped_out_at: float = 0.0
    #: parked for another service's request, and resumed from host memory for its own
    swaps_out: int = 0
    swaps_in: int = 0
    #: seconds from a request's wake to the resumed replica's first passing health check
    swap_in_s: Histogram = field(default_factory=lambda: Histogram(SWAP_BUCKETS))
    last_swap_in_s: float | None = None

    @property
    def spec(self) -> ServiceSpec:
        return self.stored.spec

    @property
    def name(self) -> str:
        return self.stored.spec.name

    def event(self, text: str) -> None:
        self.events.append((time.time(), text))
        about_service(self.name, self.stored.uid).info("%s", text)

    def swapped_out(self) -> bool:
        """Parked for another service and not asked for since."""
        return self.swapped_out_at > self.traffic.last_request

    def resident(self) -> bool:
        """Whether a replica holds GPU memory (anything but parked, or nothing at all)."""
        return any(r.state not in ("suspended", "resuming") for r in self.replicas.values())

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.stopping is None and r.state not in PARKED]

    def parked(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.stopping is None and r.state in PARKED]

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.routable()]

    def next_index(self) -> int:
        used = {r.index for r in self.replicas.values()}
        return next(i for i in range(len(used) + 1) if i not in used)

    def summary(self) -> dict[str, Any]:
        """Its line in `service ls --json`: what anyone on the node may see."""
        spec = self.spec
        traffic = self.traffic
        return {
            "name": spec.name,
            "user": self.stored.user,
            "uid": self.stored.uid,
            "replicas": {
                "ready": len(self.ready()),
                "desired": self.desired,
                "min": spec.min_replicas,
                "max": spec.max_replicas,
                "starting": sum(1 for r in self.live() if r.state != "ready"),
                "suspended": sum(1 for r in self.parked() if r.state == "suspended"),
            },
            "requests_total": traffic.requests_total,
            "in_flight": traffic.in_flight,
            "queued": traffic.queued,
            "errors_total": sum(n for code, n in traffic.statuses.items() if code >= 500),
            "memory": spec.memory,
            "compute": spec.compute // 10,
            "mode": spec.mode.value,
            "priority": spec.priority.value,
            "concurrency": spec.concurrency,
            "models": list(spec.model_names),
            "generation": self.stored.generation,
            "restarts": self.restarts,
            "gpus": sorted({g for r in self.replicas.values() for g in r.gpus}),
            "problem": self.problem,
            "created_at": self.stored.created_at,
            "keep_alive_s": spec.keep_alive_s,
            "resident": self.resident(),
            "swaps": {
                "out": self.swaps_out,
                "in": self.swaps_in,
                "in_seconds_sum": round(self.swap_in_s.raw()[1], 6),
                "last_in_s": self.last_swap_in_s,
            },
        }

    def describe(self, may_see: Callable[[int], bool]) -> dict[str, Any]:
        """`service describe`: its summary, spec (command, environment and directory only for
        those `may_see` lets see its owner's), replicas, answers by status and events."""
        data = self.summary()
        spec = self.spec.to_json()
        if not may_see(self.stored.uid):
            spec.update(argv=None, env=None, workdir=None)
        data["spec"] = spec
        data["why"] = self.why
        data["statuses"] = {str(k): v for k, v in sorted(self.traffic.statuses.items())}
        data["replica_list"] = [
            r.to_json() for r in sorted(self.replicas.values(), key=lambda r: r.index)
        ]
        data["events"] = [{"at": at, "detail": text} for at, text in self.events]
        data["ended"] = {str(index): job for index, job in sorted(self.ended.items())}
        return data


def how_it_ended(job: Job, events: list[dict[str, Any]]) -> str:
    """`ended: failed, exit code 3 (exit code 3)`: its state, code and last event's detail."""
    detail = f" ({str(events[-1]['detail'])[:200]})" if events else ""
    return f"ended: {job.state.value}, exit code {job.exit_code}{detail}"
