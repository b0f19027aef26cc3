"""The daemon's live target workload: the recently submitted shapes, kept in its store.

The fragmentation-aware policies (`gpupool`, `fgd`) score a placement against the shapes the
node expects next. The daemon learns them from what is submitted to it
(scheduler/recent.py: a decaying window over a built-in prior) and saves the window in its
SQLite store with each submission, so a restarted daemon resumes the same window. It places by
the window's target as it was when last taken up: a new one is taken up when a shape's
probability moved by more than scheduler.recent.TARGET_MOVED, as in the extender.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

from gpupool.agent.logs import log
from gpupool.agent.store import Store
from gpupool.core.errors import InvalidRequest
from gpupool.scheduler.gpus import GpuRequest
from gpupool.scheduler.packing import share_prices
from gpupool.scheduler.recent import RecentShapes, moved
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
        self._placing: TargetWorkload | None = None
        if saved is not None:
            try:
                self._recent = RecentShapes.from_json(saved)
            except InvalidRequest as err:  # a store written by hand: start again from the prior
                log.warning("target workload not restored, starting from the prior: %s", err)

    @contextlib.contextmanager
    def submitting(self, requests: Sequence[GpuRequest]) -> Iterator[dict[str, str]]:
        """Shares of these shapes are being submitted: yields the store settings that keep the
        window with them, for the submit to write with the jobs (one transaction). The shapes
        count once the block ends without an error: a submit the store refused does not."""
        with self._lock:
            after = RecentShapes(dict(self._recent.weights))
            for request in requests:
                after.add(request)
            yield {SETTING: after.to_json()}
            self._recent = after

    def target(self) -> TargetWorkload:
        """The target to place by: the window's, taken up when it moved from the one placed by
        so far (scheduler.recent.moved), not after every submission, since what is kept per
        target (the share prices, the spec tables) is made again for a new one."""
        with self._lock:
            return self._taken_up()

    def _taken_up(self) -> TargetWorkload:
        window = self._recent.target()
        if self._placing is None or moved(self._placing, window):
            self._placing = window
        return self._placing

    def describe(self) -> list[dict[str, object]]:
        """The heaviest shapes with their probabilities, each share with its price in the
        target placed by (GET /v1/node)."""
        with self._lock:
            return self._recent.describe(prices=share_prices(self._taken_up()))
