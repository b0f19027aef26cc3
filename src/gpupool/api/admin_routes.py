"""The admins' routes: POST /v1/prune (delete finished jobs, their events and directories)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field

from gpupool.agent.agent import Agent


class PruneBody(BaseModel):
    #: jobs that finished longer ago than this go; 0: every finished job
    older_than_s: float = Field(ge=0, allow_inf_nan=False)


def register(app: FastAPI, agent: Agent, caller: Callable[..., Awaitable[int]]) -> None:
    """Add POST /v1/prune to `app`."""
    access = agent.view.access

    @app.post("/v1/prune")
    def prune(body: PruneBody, uid: int = Depends(caller)) -> dict[str, Any]:
        """Delete the jobs that finished more than `older_than_s` seconds ago; how many."""
        access.require_admin(uid, "pruning finished jobs")
        return {"pruned": agent.prune(body.older_than_s), "older_than_s": body.older_than_s}
