"""The job and share of each GPU process in `gpupool gpus`, as the node daemon's watchdog sees
them (GET /v1/processes); without a daemon, `gpus` shows no marks and says why once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.client import Client
from gpupool.core.errors import GpupoolError
from gpupool.core.units import format_bytes

#: a daemon that does not answer this fast leaves the table unmarked rather than late
TIMEOUT_S = 2.0
#: the mark of a process the daemon's last pass did not list (it started since)
UNSEEN = "-"

Marks = Mapping[tuple[int, int], str]


def mark(process: Mapping[str, Any]) -> str:
    """`job 3, 2GiB share`, `job 3, over 2GiB share`, `no job`, or, for what the watchdog
    never kills, `no job, graphics` and `no job, exempt`."""
    if process["job"] is None:
        if process["kind"] == "graphics":
            return "no job, graphics"
        return "no job" if process["exempt"] is None else "no job, exempt"
    share = format_bytes(process["share"] or 0)
    over = "over " if process["over_share"] else ""
    return f"job {process['job']}, {over}{share} share"


def daemon_marks(url: str | None) -> tuple[Marks | None, str]:
    """The marks by (GPU index, pid), or None and the reason when no daemon answers."""
    try:
        with Client(url, timeout=TIMEOUT_S) as client:
            answer = client.call("GET", "/v1/processes")
    except GpupoolError as err:
        return None, f"no job marks: {err}"
    return {(p["gpu"], p["pid"]): mark(p) for p in answer["processes"]}, ""
