"""The daemon's live target workload: the recently submitted shapes, kept in its store.

The fragmentation-aware policies (`gpupool`, `fgd`) score a placement against the shapes the
node expects next. The daemon learns them from what is submitted to it
(scheduler/recent.py: a decaying window over a built-in prior) and saves the window in its
SQLite store after each submission, so a restarted daemon places as the old one would.
"""

from __future__ import annotations

import threading

from gpupool.agent.logs import log
from gpupool.agent.store import Store
from gpupool.core.errors import InvalidRequest
from gpupool.scheduler.gpus import GpuRequest
from gpupool.scheduler.recent import RecentShapes
from gpupool.scheduler.workload import TargetWorkload

#: the store setting that holds the window
SETTING = "target_workload"


class LiveTarget:
    """The window of recent shapes, loaded from and saved to `store`; thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        saved = store.setting(SETTING)
        self._recent = RecentShapes()
        if saved is not None:
            try:
                self._recent = RecentShapes.from_json(saved)
            except InvalidRequest as err:  # a store written by hand: start again from the prior
                log.warning("target workload not restored, starting from the prior: %s", err)

    def submitted(self, request: GpuRequest) -> None:
        """One more share of this shape was submitted: weigh it in, and save the window."""
        with self._lock:
            self._recent.add(request)
            text = self._recent.to_json()
        self._store.set_setting(SETTING, text)

    def target(self) -> TargetWorkload:
        with self._lock:
            return self._recent.target()

    def describe(self) -> list[dict[str, object]]:
        """The heaviest shapes with their probabilities (GET /v1/node)."""
        with self._lock:
            return self._recent.describe()
