"""Elastic memory's routes: POST /v1/jobs/N/suspend, /resume and /resize (a running shim job's
memory moved to host memory and back, or its share changed while it runs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict

from gpupool.agent.access import user_name
from gpupool.agent.agent import Agent
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import parse_compute_percent


class NoBody(BaseModel):
    """Empty: every POST carries a JSON body (guard.py)."""

    model_config = ConfigDict(extra="forbid")


class ResizeBody(BaseModel):
    """The new share: a memory size or percent of each GPU, and/or a compute percent."""

    model_config = ConfigDict(extra="forbid")
    memory: str | None = None
    compute: float | None = None


def register(app: FastAPI, agent: Agent, caller: Callable[..., Awaitable[int]]) -> None:
    """Add the suspend, resume and resize routes to `app`."""

    @app.post("/v1/jobs/{job_id}/suspend")
    def suspend(job_id: int, _: NoBody, uid: int = Depends(caller)) -> dict[str, Any]:
        job = agent.suspend(job_id, uid, user_name(uid))
        return {"job": agent.view.job_json(job)}

    @app.post("/v1/jobs/{job_id}/resume")
    def resume(job_id: int, _: NoBody, uid: int = Depends(caller)) -> dict[str, Any]:
        job = agent.resume(job_id, uid, user_name(uid))
        return {"job": agent.view.job_json(job)}

    @app.post("/v1/jobs/{job_id}/resize")
    def resize(job_id: int, body: ResizeBody, uid: int = Depends(caller)) -> dict[str, Any]:
        if body.memory is not None and not body.memory.strip():
            raise InvalidRequest("invalid memory '': give a size like 16Gi or a percent like 50%")
        compute = parse_compute_percent(body.compute) if body.compute is not None else None
        job, changed = agent.resize(job_id, uid, body.memory, compute)
        return {"job": agent.view.job_json(job), "changed": changed}
