"""The daemon's log: one stderr line per event, and a persistent error told once, not each tick.

A line about a job or a service carries it as structured context (LogRecord extras `job`,
`service`, `uid`, set by `about_job` and `about_service`, as kopf's ObjectLogger does): the plain
format shows it as a prefix ("job 12: ..."), the JSON format as fields of their own, for those
who ship the daemon's log to Loki or Elasticsearch and search it by job.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpupool.core.errors import InvalidRequest

if TYPE_CHECKING:
    from gpupool.agent.jobs import Job

#: the daemon's threads (the queue loop, the sampler) log here
log = logging.getLogger("gpupool.agent")
#: the context a line may carry, as attributes of its LogRecord
CONTEXT_FIELDS = ("job", "service", "uid")
#: a logger that adds its context to each line (a LoggerAdapter; generic in the type stubs only)
if TYPE_CHECKING:
    Context = logging.LoggerAdapter[logging.Logger]
else:
    Context = logging.LoggerAdapter


def about_job(job: Job | int, logger: logging.Logger = log) -> Context:
    """`logger` for the lines about `job`: its id, and with a whole Job its owner's uid and its
    service (a replica's)."""
    if isinstance(job, int):
        return logging.LoggerAdapter(logger, {"job": job})
    context: dict[str, Any] = {"job": job.id, "uid": job.uid}
    if job.spec.service:
        context["service"] = job.spec.service
    return logging.LoggerAdapter(logger, context)


def about_service(name: str, uid: int | None = None) -> Context:
    """`log` for the lines about service `name` (of user `uid`)."""
    context: dict[str, Any] = {"service": name}
    if uid is not None:
        context["uid"] = uid
    return logging.LoggerAdapter(log, context)


def _prefix(record: logging.LogRecord) -> str:
    """The plain format's words for a line's context: "job 12: " or "service NAME: "."""
    job = getattr(record, "job", None)
    if job is not None:
        return f"job {job}: "
    service = getattr(record, "service", None)
    return f"service {service}: " if service is not None else ""


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
        return f"gpupool serve: {level}{_prefix(record)}{text}"


class JsonLines(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message, the context
    fields the line has, and a traceback as the string `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        line: dict[str, Any] = {
            "time": at.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


#: --log-format's values: the formatter of each
FORMATS: Mapping[str, type[logging.Formatter]] = {"plain": _Lines, "json": JsonLines}


def check_format(name: str) -> str:
    """`name` if it is one of FORMATS, else the one line saying which there are."""
    if name not in FORMATS:
        raise InvalidRequest(f"invalid --log-format {name!r}: use {' or '.join(FORMATS)}")
    return name


def configure(form: str = "plain") -> None:
    """`gpupool serve`'s logging: every line of the daemon to stderr, in format `form`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATS[check_format(form)]("%(message)s"))
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
