"""The router's control channel, in one place: what the daemon and the router process say.

The router process (router_proc.py) listens on CONTROL_NAME in the state dir, a Unix socket of
mode 0600 that it serves only to a peer of its own uid (SO_PEERCRED); the daemon
(router_link.py) connects to it. Each message is one line of JSON, an object whose "t" is its
kind:

daemon to router
  table     {"services": [{"name", "owner", "concurrency", "models", "user", "created",
            "endpoints": [{"job_id", "index", "port", "generation", "draining",
            "healthy_at"}]}]}: every service, the model names it answers for at the OpenAI
            API (router_openai.py), and its ready
            replicas, whole, whenever it changes. The router serves with the last one it got,
            whether a daemon is attached or not.
  exit      stop taking connections, answer those in flight, exit (the daemon replaces it).

router to daemon
  hello     {"pid", "listen", "started", "version"}: first, on each connection. A daemon
            replaces a router of another VERSION (an upgrade that changed these messages).
  wait      {"name", "queued"}: a request waits for a replica of NAME (the autoscaler wakes on
            it at once: a scale from zero starts now).
  counters  {"services": {NAME: {"in_flight", "queued", "statuses": {CODE: N}, "latency":
            [N per bucket], "latency_sum", "last_request", "endpoints": {JOB: [IN_FLIGHT,
            BROKEN]}}}}: every COUNTERS_S. The daemon's Traffic is their mirror (`Mirror`),
            which `service ls`, /metrics and the autoscaler read as before.

Counts are the router process's since it started; `last_request` is a time.monotonic() value,
one clock for every process of the host.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from gpupool.agent.service_traffic import Endpoint, ServiceTraffic, Traffic

#: these messages' version: a change to them that an older router or daemon would misread
#: needs a new one
VERSION = 2
#: the control socket's name in the state dir
CONTROL_NAME = "router.sock"
#: the router process's pid, in the state dir (for the supervising daemon and for tests)
PID_NAME = "router.pid"
#: the router process's own log (stderr), in the state dir
LOG_NAME = "router.log"
#: seconds between two counters messages
COUNTERS_S = 0.1
#: the longest line either side reads; longer ends the connection
MAX_LINE = 4 << 20

Message = dict[str, Any]


class BadMessage(ValueError):
    """A line that is no message of this channel: the connection that sent it ends."""


def encode(kind: str, **fields: Any) -> bytes:
    return json.dumps({"t": kind, **fields}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message:
    try:
        message = json.loads(line)
    except ValueError as err:
        raise BadMessage(f"not JSON: {err}") from None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise BadMessage("not a message: an object with its kind in 't'")
    return message


# -- the table: daemon to router ------------------------------------------------------------


def table(traffic: Traffic) -> Message:
    """Every service and its published endpoints, as the daemon sends them."""
    services = [
        {
            "name": s.name,
            "owner": s.owner,
            "concurrency": s.concurrency,
            "models": list(s.models),
            "user": s.user,
            "created": s.created,
            "endpoints": [
                {
                    "job_id": e.job_id,
                    "index": e.index,
                    "port": e.port,
                    "generation": e.generation,
                    "draining": e.draining,
                    "healthy_at": e.healthy_at,
                }
                for e in s.endpoints
            ],
        }
        for s in traffic.all()
    ]
    return {"services": services}


def apply_table(traffic: Traffic, message: Message) -> None:
    """The router's copy of the table becomes `message`'s: an endpoint it knows keeps its object
    (and its requests in flight); a service no longer listed is gone (its waiters get 404)."""
    try:
        listed = {str(s["name"]): s for s in message["services"]}
        for name, fields in listed.items():
            service = traffic.add(name, int(fields["owner"]), int(fields["concurrency"]))
            service.models = tuple(str(m) for m in fields["models"])
            service.user, service.created = str(fields["user"]), float(fields["created"])
            known = {(e.job_id, e.port, e.generation): e for e in service.endpoints}
            endpoints = []
            for item in fields["endpoints"]:
                key = (int(item["job_id"]), int(item["port"]), int(item["generation"]))
                endpoint = known.get(key) or Endpoint(key[0], int(item["index"]), key[1], key[2])
                endpoint.draining = bool(item["draining"])
                # broken until a health check passes after it was found broken
                if endpoint.broken and float(item["healthy_at"]) > endpoint.broken_at:
                    endpoint.broken = False
                endpoints.append(endpoint)
            traffic.publish(name, tuple(endpoints))
    except (KeyError, TypeError, ValueError) as err:
        raise BadMessage(f"a table without {err}") from None
    for service in traffic.all():
        if service.name not in listed:
            traffic.remove(service.name)
    traffic.changed()  # a replica no longer draining or broken takes a waiting request


# -- the counters: router to daemon ---------------------------------------------------------


def counters(traffic: Traffic, busy: Iterable[Endpoint]) -> Message:
    """Every service's counters, as the router sends them; and every endpoint's, those of the
    table and those no longer in it with requests still in flight (`busy`: a replica draining)."""
    found = {}
    for s in traffic.all():
        counts, total = s.latency.raw()
        found[s.name] = {
            "in_flight": s.in_flight,
            "queued": s.queued,
            "statuses": {str(code): n for code, n in s.statuses.items()},
            "latency": counts,
            "latency_sum": total,
            "last_request": s.last_request,
        }
    endpoints = [e for s in traffic.all() for e in s.endpoints] + list(busy)
    return {"services": found, "endpoints": {e.job_id: [e.in_flight, e.broken] for e in endpoints}}


class Mirror:
    """The daemon's Traffic, fed by the router's messages. A router process that was replaced
    (it died, or its address changed) counts from zero: what the last one counted is kept as a
    base under the new one's counts, so the totals never go back."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic
        self._router: tuple[int, float] | None = None
        self._last: dict[str, tuple[Counter[int], list[int], float]] = {}
        self._base: dict[str, tuple[Counter[int], list[int], float]] = {}
        #: the endpoints of the tables sent, and those still answering requests after
        self._endpoints: dict[int, Endpoint] = {}

    def table(self) -> Message:
        """The table to send (`table`); its endpoints are the ones whose counts come back."""
        published = {e.job_id: e for s in self.traffic.all() for e in s.endpoints}
        self._endpoints = {
            job: e for job, e in self._endpoints.items() if e.in_flight or job in published
        }
        self._endpoints.update(published)
        return table(self.traffic)

    def hello(self, message: Message) -> None:
        router = (int(message["pid"]), float(message["started"]))
        if self._router is not None and router != self._router:
            self._base = {name: self._sum(name, *last) for name, last in self._last.items()}
        self._router = router

    def waiting(self, message: Message) -> None:
        service = self.traffic.get(str(message["name"]))
        if service is not None:
            service.queued = max(service.queued, int(message["queued"]))
        self.traffic.waiting(str(message["name"]))

    def counters(self, message: Message) -> None:
        try:
            for name, fields in message["services"].items():
                service = self.traffic.get(name)
                if service is not None:
                    self._apply(service, fields)
            by_job = message["endpoints"]
            for job, endpoint in self._endpoints.items():
                flight, broken = by_job.get(str(job), (0, False))
                endpoint.in_flight, endpoint.broken = int(flight), bool(broken)
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise BadMessage(f"counters without {err}") from None

    def _apply(self, service: ServiceTraffic, fields: Message) -> None:
        statuses = Counter({int(code): int(n) for code, n in fields["statuses"].items()})
        latency = [int(n) for n in fields["latency"]]
        self._last[service.name] = (statuses, latency, float(fields["latency_sum"]))
        total, buckets, seconds = self._sum(service.name, *self._last[service.name])
        service.statuses = total
        service.latency.assign(buckets, seconds)
        service.in_flight, service.queued = int(fields["in_flight"]), int(fields["queued"])
        service.last_request = max(service.last_request, float(fields["last_request"]))

    def _sum(
        self, name: str, statuses: Counter[int], latency: list[int], seconds: float
    ) -> tuple[Counter[int], list[int], float]:
        base = self._base.get(name)
        if base is None:
            return Counter(statuses), list(latency), seconds
        counts = [a + b for a, b in zip(base[1], latency, strict=True)]
        return base[0] + statuses, counts, base[2] + seconds
