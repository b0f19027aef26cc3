"""The daemon's log: one stderr line per event, and a persistent error told once, not each tick."""

from __future__ import annotations

import logging
import sys
import time

#: the daemon's threads (the queue loop, the sampler) log here
log = logging.getLogger("gpupool.agent")
#: the most a failing loop waits before it tries again
MAX_BACKOFF_S = 5.0
#: a failure that goes on is told again at most this often
REPEAT_EVERY_S = 60.0


class _Lines(logging.Formatter):
    """`gpupool serve: MESSAGE`, with `LEVEL: ` before it from a warning up: what the daemon
    says in its normal course reads as a sentence, what needs someone's eye says so."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        level = f"{record.levelname}: " if record.levelno >= logging.WARNING else ""
        return f"gpupool serve: {level}{text}"


def configure() -> None:
    """`gpupool serve`'s logging: every line of the daemon to stderr, through _Lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


class Failures:
    """The failures in a row of one repeated task (a loop's pass): the first of each kind is
    logged with its traceback, the rest as "still failing (N times)" at most every
    REPEAT_EVERY_S; the wait before the next try doubles from `base_s` up to MAX_BACKOFF_S."""

    def __init__(self, what: str, base_s: float) -> None:
        self.what = what
        self.base_s = base_s
        self.count = 0
        self._told: set[tuple[str, str]] = set()
        self._told_at = 0.0

    def failed(self, err: Exception) -> float:
        """Note `err` (call from its `except`); how long to wait before the next try."""
        self.count += 1
        kind = (type(err).__name__, str(err)[:200])
        now = time.monotonic()
        if kind not in self._told and len(self._told) < 16:
            self._told.add(kind)
            self._told_at = now
            log.exception("%s failed: %s: %s", self.what, *kind)
        elif now - self._told_at >= REPEAT_EVERY_S:
            self._told_at = now
            log.error("%s still failing (%d times): %s: %s", self.what, self.count, *kind)
        return min(MAX_BACKOFF_S, self.base_s * 2.0 ** min(self.count, 32))

    def succeeded(self) -> None:
        """The task worked again: the next failure is told in full."""
        if self.count:
            log.info("%s works again after %d failures", self.what, self.count)
        self.count = 0
        self._told.clear()
