"""The watchdog's routes: its events, and every GPU process with its job and share.

Both are for every user, as the node's own news; what belongs to a job another user owns is kept
to its owner and the admins: that job's events are left out, and its processes' names (which are
part of its command) are None. Processes of no job keep their names, as nvidia-smi shows them to
everyone: the watchdog reports them so that someone acts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI

from gpupool.agent.view import NodeView
from gpupool.api.dashboard import visible_jobs
from gpupool.core.errors import InvalidRequest

MAX_EVENTS = 10_000


def register(app: FastAPI, view: NodeView, caller: Callable[..., Awaitable[int]]) -> None:
    """Add GET /v1/events and GET /v1/processes to `app`."""

    @app.get("/v1/events")
    def events(since: float = 0.0, limit: int = 100, uid: int = Depends(caller)) -> dict[str, Any]:
        """The watchdog's events (node events and the caller's jobs' events), oldest first: the
        newest `limit` at or after `since` (Unix time)."""
        if not 1 <= limit <= MAX_EVENTS:
            raise InvalidRequest(f"invalid limit {limit}: must be 1 to {MAX_EVENTS}")
        found = view.watchdog_events(since, limit)
        shown = visible_jobs(view, uid, (e["job_id"] for e in found if e["job_id"] is not None))
        return {
            "action": view.watchdog_action.value,
            "events": [e for e in found if e["job_id"] is None or e["job_id"] in shown],
        }

    @app.get("/v1/processes")
    def processes(uid: int = Depends(caller)) -> dict[str, Any]:
        """Every GPU process of the watchdog's last pass, with its job and share."""
        found = [process.to_json() for process in view.processes()]
        shown = visible_jobs(view, uid, (p["job"] for p in found if p["job"] is not None))
        for process in found:
            if process["job"] is not None and process["job"] not in shown:
                process["name"] = None
        return {"context_reserve": view.context_reserve, "processes": found}
