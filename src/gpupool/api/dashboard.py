"""The web dashboard at `/` and its data at `/v1/dashboard`.

`dashboard_data` gathers what a person watching the node wants in one answer (GPUs with the jobs
on them, jobs, recent utilisation, recent events); `/v1/dashboard` serves it as JSON (`gpupool
top` reads it too), `/` renders it as HTML (`dashboard_html.py`), and the page's script fetches
`/dashboard/parts` every few seconds, the same HTML fragments rendered again, so the page is
drawn in one place only (Python) and works without JavaScript too.

Over TCP a browser cannot send the bearer header: `/?token=TOKEN` once sets an HttpOnly,
SameSite=Strict cookie and redirects to `/`; the cookie is accepted by the dashboard's read-only
routes only, never by the API that changes anything.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from gpupool.agent.agent import Agent
from gpupool.agent.jobs import Job, State
from gpupool.api import dashboard_html
from gpupool.core.units import MILLI_PER_GPU

COOKIE = "gpupool_token"
EVENTS_SHOWN = 30
Caller = Callable[[Request], Awaitable[int]]


def recent_events(agent: Agent, limit: int = EVENTS_SHOWN) -> list[dict[str, Any]]:
    """The events panel's rows, newest first: {at, job_id, kind, detail}, job_id None for an
    event of the node rather than of a job. Every source of events is merged here, so the page
    shows them all."""
    merged = agent.store.recent_events(limit) + agent.store.node_events((), limit=limit)
    return sorted(merged, key=lambda event: event["at"], reverse=True)[:limit]


def _job_row(agent: Agent, job: Job) -> dict[str, Any]:
    live = agent.live(job.id)
    share = job.memory_per_gpu()
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "state": job.state.value,
        "priority": job.spec.priority.value,
        "mode": job.spec.mode.value,
        "gpus": list(job.gpus),
        "gpu_count": job.spec.gpus,
        "memory_used": live.memory if live else None,
        "memory_share": share * job.spec.gpus if share is not None else None,
        "compute_used": live.utilization if live else None,
        "compute_share": round(job.spec.request().compute * 100 / MILLI_PER_GPU),
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
    }


def dashboard_data(agent: Agent) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-ready data."""
    observed = agent.observed
    snapshot = observed.snapshot
    jobs = agent.jobs()
    running = [job for job in jobs if job.state is State.RUNNING]
    gpus = []
    for gpu in snapshot.gpus if snapshot is not None else ():
        on_gpu = []
        for job in running:
            if gpu.index not in job.gpus:
                continue
            usage = observed.per_gpu.get((job.id, gpu.index))
            position = job.gpus.index(gpu.index)
            share = job.memory[position] if position < len(job.memory) else None
            on_gpu.append(
                {
                    "id": job.id,
                    "name": job.name,
                    "user": job.user,
                    "memory_used": usage.memory if usage else 0,
                    "memory_share": share or gpu.memory_total,
                    "compute_used": usage.utilization if usage else None,
                    "compute_share": round(job.spec.request().compute * 100 / MILLI_PER_GPU),
                }
            )
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memory_total": gpu.memory_total,
                "memory_used": gpu.memory_used,
                "utilization": gpu.utilization,
                "temperature": gpu.temperature,
                "power_w": gpu.power_w,
                "healthy": gpu.healthy,
                "jobs": on_gpu,
            }
        )
    points = observed.recent()
    return {
        "time": time.time(),
        "simulated": agent.backend.simulated,
        "draining": agent.draining,
        "policy": agent.config.policy,
        "gpus": gpus,
        "jobs": [_job_row(agent, job) for job in jobs],
        "history": {
            "at": [point.at for point in points],
            "utilization": [list(point.utilization) for point in points],
        },
        "events": recent_events(agent),
    }


def dashboard_router(agent: Agent, token: str | None, caller: Caller) -> APIRouter:
    """The dashboard's routes; over TCP they take the bearer header or the token cookie."""
    router = APIRouter()

    async def viewer(request: Request) -> int:
        cookie = request.cookies.get(COOKIE, "")
        if token is not None and cookie and hmac.compare_digest(cookie, token):
            return 0
        return await caller(request)

    @router.get("/", response_class=HTMLResponse, response_model=None)
    async def page(request: Request) -> Response:
        given = request.query_params.get("token")
        if given is not None:  # the one visit that sets the cookie; the token leaves the URL
            if token is None or not hmac.compare_digest(given, token):
                message = "wrong token in ?token=: use the daemon's --token-file"
                return JSONResponse({"error": "Unauthorized", "message": message}, 401)
            moved = RedirectResponse("/", status_code=303)
            moved.set_cookie(COOKIE, given, httponly=True, samesite="strict")
            return moved
        await viewer(request)
        return HTMLResponse(dashboard_html.page(dashboard_data(agent)))

    @router.get("/dashboard/parts", dependencies=[Depends(viewer)])
    def parts() -> dict[str, Any]:
        return dashboard_html.parts(dashboard_data(agent))

    @router.get("/v1/dashboard", dependencies=[Depends(viewer)])
    def data() -> dict[str, Any]:
        return dashboard_data(agent)

    @router.get("/jobs/{job_id}", response_class=HTMLResponse, dependencies=[Depends(viewer)])
    def job_page(job_id: int) -> str:
        return dashboard_html.job_page(agent.describe(job_id))

    return router
