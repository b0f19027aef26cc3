"""The daemon's REST API, version 1 (FastAPI; OpenAPI at /docs and /openapi.json).

Who calls: on the Unix socket, the peer's uid from SO_PEERCRED (`server.py` puts it in the ASGI
scope); on TCP, whoever holds the bearer token, acting as the daemon's own user. What a caller may
do and see is `agent.view.access`'s to say: every job's share is public, its command, logs and
events are its owner's and the admins'. `guard.py` checks every request before a route runs.
Errors of the error tree become 4xx/5xx with `{"error": class name, "message": one line}`.
The routes read through `agent.view` (agent/view.py) and act through the agent's commands
(submit, cancel, drain, prune), never through its parts.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable
from functools import partial
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gpupool import __version__
from gpupool.agent.access import user_name
from gpupool.agent.agent import Agent
from gpupool.agent.jobs import LAUNCHABLE_MODES, JobSpec
from gpupool.api import (
    admin_routes,
    elastic_routes,
    error_bodies,
    service_routes,
    slurm_routes,
    watchdog_routes,
)
from gpupool.api.dashboard import Sessions, dashboard_router
from gpupool.api.guard import OVER_TCP, PEER_UID, Guard, host_names
from gpupool.api.metrics import metrics_router
from gpupool.api.params import LOG_CHUNK, LogOffset
from gpupool.api.submit_batch import SubmitBatcher
from gpupool.core.errors import InvalidRequest, Unauthorized
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import parse_compute_percent
from gpupool.slurm.node import SlurmNode


class SubmitBody(BaseModel):
    argv: list[str] = Field(min_length=1)
    gpus: int = Field(1, ge=1)
    memory: str | None = None
    compute: float = Field(100.0, description="percent of each GPU, a whole number from 1 to 100")
    #: default shim, or mig when `mig_profile` is given
    mode: str | None = None
    priority: str = "high"
    gpu_models: list[str] = []
    name: str = ""
    env: dict[str, str] = {}
    workdir: str = "/"
    #: mode mig: the instance's profile; given alone, it implies mode mig
    mig_profile: str | None = None
    #: a low job's memory past its share, host-backed (elastic memory)
    memory_burst: str | None = None


class DrainBody(BaseModel):
    on: bool = True


class CancelBody(BaseModel):
    """Empty: a cancel is a POST, and every POST carries a JSON body (guard.py)."""

    model_config = ConfigDict(extra="forbid")


def _spec(body: SubmitBody) -> JobSpec:
    try:
        mode = Mode(body.mode or (Mode.MIG if body.mig_profile is not None else Mode.SHIM))
    except ValueError:
        modes = ", ".join(m.value for m in LAUNCHABLE_MODES)
        raise InvalidRequest(f"unknown mode {body.mode!r}: use one of {modes}") from None
    try:
        priority = Priority(body.priority)
    except ValueError:
        raise InvalidRequest(f"unknown priority {body.priority!r}: use high or low") from None
    return JobSpec(
        argv=tuple(body.argv),
        gpus=body.gpus,
        compute=parse_compute_percent(body.compute),
        memory=body.memory,
        mode=mode,
        priority=priority,
        gpu_models=tuple(body.gpu_models),
        name=body.name,
        env=dict(body.env),
        workdir=body.workdir,
        mig_profile=body.mig_profile,
        memory_burst=body.memory_burst,
    )


def bearer(request: Request) -> bytes:
    """The bearer token a request carries, as the bytes sent: compared as bytes, a token with
    characters outside ASCII is simply wrong (401), never an error of the comparison."""
    for key, value in request.scope.get("headers", ()):
        if key.lower() == b"authorization":
            scheme, _, given = bytes(value).strip().partition(b" ")
            return given.strip() if scheme.lower() == b"bearer" else b""
    return b""


def create_app(
    agent: Agent,
    token: str | None = None,
    *,
    allowed_hosts: Iterable[str] = (),
    secure_cookies: bool = False,
    slurm: SlurmNode | None = None,
) -> Guard:
    """The app for `agent`, behind its guard. `token` guards TCP connections (None: TCP refuses
    everyone); `allowed_hosts`: names besides localhost a Host header may carry (the --listen
    host, --allowed-host); `secure_cookies`: TCP is TLS, so the dashboard's cookie is Secure;
    `slurm`: this Slurm node's jobs' shares (/v1/slurm, docs/slurm.md), on a Slurm node."""
    view = agent.view
    access = view.access
    secret = None if token is None else token.encode()
    app = FastAPI(title="gpupool node daemon", version=__version__, docs_url=None, openapi_url=None)

    async def caller(request: Request) -> int:
        if request.scope.get(OVER_TCP):
            given = bearer(request)
            if secret is None or not given or not hmac.compare_digest(given, secret):
                raise Unauthorized("a bearer token is needed (GPUPOOL_TOKEN)")
            return access.daemon_uid
        uid = request.scope.get(PEER_UID)
        return int(uid) if uid is not None else access.daemon_uid

    error_bodies.install(app)

    # the docs take the same caller as the API: over TCP they need the token too
    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(caller)])
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(caller)])
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=app.title)

    @app.get("/v1/health")
    def health(_: int = Depends(caller)) -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    @app.get("/v1/jobs")
    def list_jobs(all: bool = False, uid: int = Depends(caller)) -> Response:
        # encoded by the agent, which keeps each finished job's entry: `ps --all` stays fast
        body = view.jobs_json(all, partial(access.may_see, uid))
        return Response(body, media_type="application/json")

    # stored off the event loop, a batch of waiting submits per transaction (submit_batch.py)
    submits = SubmitBatcher(agent)

    @app.post("/v1/jobs", status_code=201)
    async def submit(body: SubmitBody, uid: int = Depends(caller)) -> Response:
        stored = await submits.submit(_spec(body), uid)
        return Response(stored, status_code=201, media_type="application/json")

    @app.get("/v1/jobs/{job_id}")
    def describe(job_id: int, uid: int = Depends(caller)) -> dict[str, Any]:
        job = view.job(job_id)
        access.require_owner(uid, job.uid, job_id, "see its command, logs and events")
        data = view.describe(job_id)
        data["mps_server"] = view.mps_server(view.job(job_id))
        live = view.live(job_id)
        data["live_memory"] = live.memory if live else None
        data["utilization"] = live.utilization if live else None
        data["over_share"] = view.over_share(job_id)
        return data

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: int, _: CancelBody, uid: int = Depends(caller)) -> dict[str, Any]:
        return {"job": agent.cancel(job_id, uid, user_name(uid)).to_json()}

    @app.get("/v1/jobs/{job_id}/logs")
    def logs(
        job_id: int, stream: str = "stdout", offset: LogOffset = 0, uid: int = Depends(caller)
    ) -> dict[str, Any]:
        job = view.job(job_id)
        access.require_owner(uid, job.uid, job_id, "read its logs")
        data, start = view.read_log(job_id, stream, offset, LOG_CHUNK)
        return {
            "data": data.decode(errors="replace"),
            "offset": start + len(data),
            "finished": job.state.finished,
        }

    @app.post("/v1/drain")
    def drain(body: DrainBody, uid: int = Depends(caller)) -> dict[str, Any]:
        agent.drain(body.on, uid)
        return view.node_json()

    @app.get("/v1/node")
    def node(_: int = Depends(caller)) -> dict[str, Any]:
        return view.node_json()

    watchdog_routes.register(app, view, caller)
    admin_routes.register(app, agent, caller)
    elastic_routes.register(app, agent, caller)
    service_routes.register(app, agent, caller)
    if slurm is not None:
        slurm_routes.register(app, slurm, view, access, caller)
    app.include_router(metrics_router(view, caller))
    sessions = Sessions(os.urandom(32), secure=secure_cookies)
    app.include_router(dashboard_router(view, secret, sessions, caller))
    return Guard(app, access, host_names(allowed_hosts))
