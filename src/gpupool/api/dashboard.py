"""The web dashboard at `/` and its data at `/v1/dashboard`.

`dashboard_data` gathers what a person watching the node wants in one answer (GPUs with the jobs
on them, jobs, recent utilisation, recent events); `/v1/dashboard` serves it as JSON (`gpupool
top` reads it too), `/` renders it as HTML (`dashboard_html.py`), and the page's script fetches
`/dashboard/parts` every few seconds, the same HTML fragments rendered again, so the page is
drawn in one place only (Python) and works without JavaScript too.

A viewer sees every job's share, and the events of the jobs they may see (their own; all of
them for an admin), as `ps` does. Over the Unix socket the viewer is the peer's uid. Over TCP a
browser cannot send the bearer header: `/?token=TOKEN` once opens a session, a signed cookie
(HttpOnly, SameSite=Strict, Secure under TLS) that names the daemon's user and an expiry, never
the token itself, and redirects to `/`; the cookie is accepted by the dashboard's read-only routes
only, never by the API that changes anything.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from gpupool.agent.jobs import Job, State
from gpupool.agent.view import NodeView
from gpupool.api import dashboard_html
from gpupool.api.dashboard_services import services_data
from gpupool.api.guard import OVER_TCP
from gpupool.core.errors import NotFound, Unauthorized
from gpupool.core.units import MILLI_PER_GPU

COOKIE = "gpupool_session"
#: how long a dashboard session lasts
SESSION_S = 12 * 3600
EVENTS_SHOWN = 30
Caller = Callable[[Request], Awaitable[int]]
_SESSION = re.compile(r"(\d{1,10})\.(\d{1,12})\.([0-9a-f]{64})", re.ASCII)


@dataclass(frozen=True)
class Sessions:
    """Dashboard sessions: a cookie `UID.EXPIRY.MAC`, MAC the HMAC-SHA256 of `UID.EXPIRY` under a
    key that is random per daemon, so a session ends at its expiry or at the daemon's restart, and
    the cookie, if it leaks, is not the token."""

    key: bytes
    #: set the cookie's Secure attribute (TCP is TLS)
    secure: bool = False
    lifetime_s: float = SESSION_S

    def _mac(self, payload: str) -> str:
        return hmac.new(self.key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, uid: int) -> str:
        payload = f"{uid}.{int(time.time() + self.lifetime_s)}"
        return f"{payload}.{self._mac(payload)}"

    def check(self, cookie: str) -> int | None:
        """The session's uid, or None for a cookie that is malformed, forged or expired."""
        found = _SESSION.fullmatch(cookie)
        if found is None:
            return None
        uid, expiry, mac = found.groups()
        if not hmac.compare_digest(mac.encode(), self._mac(f"{uid}.{expiry}").encode()):
            return None
        return int(uid) if int(expiry) > time.time() else None

    def set_cookie(self, response: Response, uid: int) -> None:
        response.set_cookie(
            COOKIE,
            self.issue(uid),
            max_age=int(self.lifetime_s),
            path="/",
            secure=self.secure,
            httponly=True,
            samesite="strict",
        )


def visible_jobs(view: NodeView, uid: int, ids: Iterable[int]) -> set[int]:
    """Those of `ids` whose events and command `uid` may see (a job gone from the store: none)."""
    access = view.access
    if access.is_admin(uid):
        return set(ids)
    shown = set()
    for job_id in set(ids):
        try:
            owner = view.owner(job_id)
        except NotFound:
            continue
        if access.may_see(uid, owner):
            shown.add(job_id)
    return shown


def recent_events(view: NodeView, uid: int, limit: int = EVENTS_SHOWN) -> list[dict[str, Any]]:
    """The events panel's rows that `uid` may see, newest first: {at, job_id, kind, detail},
    job_id None for an event of the node rather than of a job (the view merges every source of
    events, so the page shows them all)."""
    merged = view.recent_events(limit)
    shown = visible_jobs(view, uid, (e["job_id"] for e in merged if e["job_id"] is not None))
    return [e for e in merged if e["job_id"] is None or e["job_id"] in shown][:limit]


def _job_row(view: NodeView, job: Job) -> dict[str, Any]:
    live = view.live(job.id)
    share = job.memory_per_gpu()
    elastic = view.elastic(job.id) or {}
    suspended = elastic.get("state", "running") != "running"
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        # a suspended job still runs: its memory is in host memory
        "state": elastic["state"] if suspended else job.state.value,
        "memory_host": elastic.get("host_bytes", 0)
        + elastic.get("burst_bytes", 0)
        - elastic.get("burst_on_device", 0),
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


def dashboard_data(view: NodeView, uid: int) -> dict[str, Any]:
    """Everything the dashboard shows to `uid`, as JSON-ready data."""
    snapshot = view.snapshot()
    per_gpu = view.usage_per_gpu()
    jobs = view.jobs()
    running = [job for job in jobs if job.state is State.RUNNING]
    gpus = []
    for gpu in snapshot.gpus if snapshot is not None else ():
        on_gpu = []
        for job in running:
            if gpu.index not in job.gpus:
                continue
            usage = per_gpu.get((job.id, gpu.index))
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
    points = view.history()
    return {
        "time": time.time(),
        "simulated": view.simulated,
        "draining": view.draining,
        "policy": view.policy,
        "gpus": gpus,
        "jobs": [_job_row(view, job) for job in jobs],
        "history": {
            "at": [point.at for point in points],
            "utilization": [list(point.utilization) for point in points],
        },
        "events": recent_events(view, uid),
        "services": services_data(view),
    }


def dashboard_router(
    view: NodeView, token: bytes | None, sessions: Sessions, caller: Caller
) -> APIRouter:
    """The dashboard's routes; over TCP they take the bearer header or a session cookie."""
    router = APIRouter()
    access = view.access

    async def viewer(request: Request) -> int:
        if request.scope.get(OVER_TCP):
            uid = sessions.check(request.cookies.get(COOKIE, ""))
            if uid is not None:
                return uid
        return await caller(request)

    @router.get("/", response_class=HTMLResponse, response_model=None)
    async def page(request: Request) -> Response:
        given = request.query_params.get("token")
        if given is not None:  # the one visit that opens a session; the token leaves the URL
            if token is None or not hmac.compare_digest(given.encode(), token):
                raise Unauthorized("wrong token in ?token=: use the daemon's --token-file")
            moved = RedirectResponse("/", status_code=303)
            sessions.set_cookie(moved, access.daemon_uid)
            return moved
        uid = await viewer(request)
        # the store is read in the thread pool, never on the event loop
        data = await run_in_threadpool(dashboard_data, view, uid)
        return HTMLResponse(dashboard_html.page(data))

    @router.get("/dashboard/parts")
    def parts(uid: int = Depends(viewer)) -> dict[str, Any]:
        return dashboard_html.parts(dashboard_data(view, uid))

    @router.get("/v1/dashboard")
    def data(uid: int = Depends(viewer)) -> dict[str, Any]:
        return dashboard_data(view, uid)

    @router.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(job_id: int, uid: int = Depends(viewer)) -> str:
        owner = view.owner(job_id)
        access.require_owner(uid, owner, job_id, "see its command and events")
        return dashboard_html.job_page(view.describe(job_id))

    return router
