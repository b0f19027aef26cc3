"""The watchdog's routes: its events, and every GPU process with its job and share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI

from gpupool.agent.agent import Agent
from gpupool.agent.watchdog import KINDS
from gpupool.core.errors import InvalidRequest

MAX_EVENTS = 10_000


def register(app: FastAPI, agent: Agent, caller: Callable[..., Awaitable[int]]) -> None:
    """Add GET /v1/events and GET /v1/processes to `app`."""

    @app.get("/v1/events")
    def events(since: float = 0.0, limit: int = 100, _: int = Depends(caller)) -> dict[str, Any]:
        """The watchdog's events (node events and jobs' events), oldest first: the newest
        `limit` at or after `since` (Unix time)."""
        if not 1 <= limit <= MAX_EVENTS:
            raise InvalidRequest(f"invalid limit {limit}: must be 1 to {MAX_EVENTS}")
        return {
            "action": agent.watchdog.action.value,
            "events": agent.store.node_events(KINDS, since, limit),
        }

    @app.get("/v1/processes")
    def processes(_: int = Depends(caller)) -> dict[str, Any]:
        """Every GPU process of the watchdog's last pass, with its job and share."""
        return {
            "context_reserve": agent.context_reserve,
            "processes": [process.to_json() for process in agent.watchdog.processes],
        }
