"""What the daemon saw, kept for /metrics, the web dashboard and `gpupool top`.

The sampler hands each snapshot here; the queue loop its scheduling times. Everything is held in
fixed-size structures (the last snapshot, a ring of recent utilisation, histograms with fixed
buckets), so a daemon that has run a million jobs holds no more than one that ran ten.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.agent.usage import Usage, usage_per_gpu
from gpupool.devices.snapshot import NodeSnapshot

#: seconds: a pass of the queue takes milliseconds; a job may wait hours
SCHEDULING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
WAIT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
#: how far back the utilisation ring reaches
HISTORY_S = 600.0


@dataclass(frozen=True)
class HistogramReading:
    """Cumulative counts per upper bound (the last one +Inf), the sum and the count."""

    buckets: tuple[tuple[float, int], ...]
    total: float
    count: int


class Histogram:
    """A thread-safe histogram with fixed buckets (no third-party type below the API layer)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self._total = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self._bounds, value)] += 1
            self._total += value

    def raw(self) -> tuple[list[int], float]:
        """The count in each bucket (not cumulative) and the sum."""
        with self._lock:
            return list(self._counts), self._total

    def assign(self, counts: Sequence[int], total: float) -> None:
        """Take `raw()`'s values of another histogram of the same bounds (a mirror's)."""
        if len(counts) != len(self._counts):
            raise ValueError(f"{len(counts)} buckets, not {len(self._counts)}")
        with self._lock:
            self._counts, self._total = [int(n) for n in counts], float(total)

    def read(self) -> HistogramReading:
        with self._lock:
            counts, total = list(self._counts), self._total
        cumulative, running = [], 0
        for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramReading(tuple(cumulative), total, running)


@dataclass(frozen=True)
class HistoryPoint:
    at: float
    utilization: tuple[int | None, ...]  # percent per GPU, in snapshot order


class Observations:
    """The last snapshot, usage per job and GPU, recent utilisation, and scheduling times."""

    def __init__(self, history_s: float = HISTORY_S, sample_s: float = 1.0) -> None:
        self.snapshot: NodeSnapshot | None = None
        self.per_gpu: dict[tuple[int, int], Usage] = {}
        self.history: deque[HistoryPoint] = deque(maxlen=max(2, round(history_s / sample_s)))
        self.scheduling = Histogram(SCHEDULING_BUCKETS)
        self.queue_wait = Histogram(WAIT_BUCKETS)

    def sampled(self, snapshot: NodeSnapshot, groups: Mapping[int, int]) -> None:
        """Keep a snapshot from the sampler (its readers take whole references: no lock)."""
        self.per_gpu = usage_per_gpu(snapshot, groups)
        self.snapshot = snapshot
        point = HistoryPoint(snapshot.timestamp, tuple(gpu.utilization for gpu in snapshot.gpus))
        self.history.append(point)

    def recent(self, since: float | None = None) -> list[HistoryPoint]:
        """The ring's points, oldest first (newer than `since` when given)."""
        points = list(self.history)
        return [p for p in points if since is None or p.at > since]

    def started(self, submitted_at: float, now: float | None = None) -> None:
        """A job left the queue: its wait goes in the histogram."""
        self.queue_wait.observe(max(0.0, (time.time() if now is None else now) - submitted_at))
