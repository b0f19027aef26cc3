"""How many replicas a service wants: its load (requests in flight and waiting) against its
concurrency target, as Knative's autoscaler does.

Up at once: the load now, divided by the target, rounded up. Down only after a stable window:
the most load seen over the last `window_s`, so a lull between bursts takes nothing away. To
zero (MIN 0) once no request came for `idle_s` (or its `keep_alive_s`, which needs no stable
window: Ollama's keep_alive); a request waiting for a replica brings one back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpupool.agent.services import ServiceSpec


@dataclass(frozen=True)
class Decision:
    replicas: int
    why: str


class Autoscaler:
    """One service's scaler: it keeps the load samples of the last window."""

    def __init__(self, now: float) -> None:
        self._samples: deque[tuple[float, int]] = deque()
        #: when the replica count last changed (a scale-down waits a whole window after it)
        self._changed_at = now
        self._last = -1

    def decide(
        self, spec: ServiceSpec, load: int, queued: int, last_request: float, now: float
    ) -> Decision:
        """The replicas `spec` wants now; `last_request`: time.monotonic() of the last one."""
        self._samples.append((now, load))
        while self._samples and self._samples[0][0] < now - spec.window_s:
            self._samples.popleft()
        current = max(self._last, 0)
        now_want = math.ceil(load / spec.concurrency)
        stable_want = math.ceil(max(n for _, n in self._samples) / spec.concurrency)
        if now_want > current:
            wanted, why = now_want, f"{load} requests against a concurrency of {spec.concurrency}"
        elif stable_want < current and now - self._changed_at >= spec.window_s:
            wanted = stable_want
            why = f"at most {wanted * spec.concurrency} requests over {spec.window_s:g}s"
        else:
            wanted, why = current, ""
        idle = load == 0 and queued == 0 and now - last_request >= spec.resident_s
        if idle and spec.keep_alive_s is not None:
            wanted = 0  # resident for keep_alive_s after the last request, not a window more
        floor = spec.min_replicas if spec.min_replicas or idle else 1
        if queued:
            floor = max(floor, 1)
        chosen = min(spec.max_replicas, max(floor, wanted))
        if chosen == 0:
            option = "--idle" if spec.keep_alive_s is None else "--keep-alive"
            why = f"no request for {spec.resident_s:g}s ({option})" if not spec.min_replicas else ""
        elif chosen > wanted:
            why = f"MIN {spec.min_replicas}" if chosen == spec.min_replicas else "in use"
        elif chosen < wanted:
            why = f"MAX {spec.max_replicas}"
        if chosen != self._last:
            self._changed_at = now
            self._last = chosen
        return Decision(chosen, why)

    def swapped_out(self, now: float, why: str) -> Decision:
        """Zero replicas at once: its memory was taken for another service's request."""
        self._samples.clear()
        if self._last != 0:
            self._changed_at, self._last = now, 0
        return Decision(0, why)
