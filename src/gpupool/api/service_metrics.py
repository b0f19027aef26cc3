"""Per-service metrics on /metrics: requests by status, latency, in flight, waiting, replicas,
swaps and swap-in times.

Read from the service manager's traffic table at each scrape, like the rest of /metrics
(api/metrics.py): a deleted service is simply absent from the next scrape. The latency histogram
has a `service` label, so it is a labelled variant of exposition.Histogram.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import utils
from prometheus_client.core import HistogramMetricFamily, Metric

from gpupool.agent.observe import HistogramReading
from gpupool.agent.service_manager import ServiceManager
from gpupool.api.exposition import Family, Histogram

#: a sample's value as the text format writes it (as exposition.py does)
_value: Callable[[float], str] = utils.floatToGoString


@dataclass
class ServiceHistogram(Histogram):
    """A histogram family with one reading per service."""

    readings: list[tuple[str, HistogramReading]] = field(default_factory=list)

    @staticmethod
    def _bounds(reading: HistogramReading) -> list[tuple[str, int]]:
        return [("+Inf" if b == float("inf") else repr(b), n) for b, n in reading.buckets]

    def to_metric(self) -> Metric:
        metric = HistogramMetricFamily(self.name, self.doc, labels=("service",))
        for service, reading in self.readings:
            metric.add_metric([service], self._bounds(reading), reading.total)
        return metric

    def write(self, lines: list[str], _formatted: object) -> None:
        lines.append(f"# HELP {self.name} {self.doc}\n# TYPE {self.name} histogram\n")
        for service, reading in self.readings:
            label = f'service="{service}"'  # a service's name needs no escaping (services.NAME)
            buckets = self._bounds(reading)
            lines.extend(
                f'{self.name}_bucket{{{label},le="{bound}"}} {_value(count)}\n'
                for bound, count in buckets
            )
            lines.append(f"{self.name}_count{{{label}}} {_value(buckets[-1][1])}\n")
            lines.append(f"{self.name}_sum{{{label}}} {_value(reading.total)}\n")


def families(services: ServiceManager | None) -> list[Family | Histogram]:
    """The services' families (none on a daemon without services)."""
    if services is None:
        return []
    requests = Family(
        "gpupool_service_requests",
        "Requests the router answered, by service and HTTP status (502: the replica failed, "
        "503: no replica in time)",
        "counter",
        ("service", "code"),
    )
    in_flight = Family(
        "gpupool_service_in_flight",
        "Requests sent to a replica and not yet answered in full",
        "gauge",
        ("service",),
    )
    queued = Family(
        "gpupool_service_queue_length",
        "Requests waiting in the router for a replica with room",
        "gauge",
        ("service",),
    )
    replicas = Family(
        "gpupool_service_replicas",
        "Replicas by state (ready, starting, draining, suspended) and the autoscaler's desired "
        "count",
        "gauge",
        ("service", "state"),
    )
    latency = ServiceHistogram(
        "gpupool_service_request_duration_seconds",
        "Time from a request's arrival at the router to the end of its answer",
        HistogramReading((), 0.0, 0),
    )
    swaps = Family(
        "gpupool_service_swaps",
        "Swaps by service and direction: out, its idle replica parked in host memory for another "
        "service's request; in, brought back for a request of its own",
        "counter",
        ("service", "direction"),
    )
    swap_in = ServiceHistogram(
        "gpupool_service_swap_in_seconds",
        "Time from a request's wake of a parked replica to its first passing health check",
        HistogramReading((), 0.0, 0),
    )
    for service in services.services():
        name = service.name
        swaps.add((name, "out"), service.swaps_out)
        swaps.add((name, "in"), service.swaps_in)
        swap_in.readings.append((name, service.swap_in_s.read()))
        traffic = service.traffic
        for code, count in sorted(traffic.statuses.items()):
            requests.add((name, str(code)), count)
        in_flight.add((name,), traffic.in_flight)
        queued.add((name,), traffic.queued)
        states = {"ready": 0, "starting": 0, "draining": 0, "suspended": 0}
        for replica in service.replicas.values():
            state = replica.to_json()["state"]
            key = {"parking": "draining", "suspending": "suspended"}.get(state, state)
            key = key if key in states else "starting"
            states[key] += 1
        for state, count in states.items():
            replicas.add((name, state), count)
        replicas.add((name, "desired"), service.desired)
        latency.readings.append((name, traffic.latency.read()))
    return [requests, in_flight, queued, replicas, latency, swaps, swap_in]
