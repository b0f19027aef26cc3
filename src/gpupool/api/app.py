"""The daemon's REST API, version 1 (FastAPI; OpenAPI at /docs and /openapi.json).

Who calls: on the Unix socket, the peer's uid from SO_PEERCRED (`server.py` puts it in the ASGI
scope); on TCP, whoever holds the bearer token, acting as the daemon's own user. Errors of the
error tree become 4xx/5xx with `{"error": class name, "message": one line}`.
"""

from __future__ import annotations

import hmac
import os
import pwd
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gpupool import __version__
from gpupool.agent.agent import Agent
from gpupool.agent.jobs import LAUNCHABLE_MODES, Job, JobSpec
from gpupool.api import watchdog_routes
from gpupool.api.dashboard import dashboard_router
from gpupool.api.metrics import metrics_router
from gpupool.core.errors import GpupoolError, InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import parse_compute_percent

#: ASGI scope keys set by the server for each connection
PEER_UID = "gpupool.peer_uid"
OVER_TCP = "gpupool.tcp"
LOG_CHUNK = 1 << 20


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


class DrainBody(BaseModel):
    on: bool = True


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
    )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def create_app(agent: Agent, token: str | None = None) -> FastAPI:
    """The app for `agent`; `token` guards TCP connections (None: TCP refuses everyone)."""
    app = FastAPI(title="gpupool node daemon", version=__version__, docs_url="/docs")

    async def caller(request: Request) -> int:
        if request.scope.get(OVER_TCP):
            header = request.headers.get("authorization", "")
            given = header.removeprefix("Bearer ").strip()
            if token is None or not given or not hmac.compare_digest(given, token):
                raise _Unauthorized
            return os.geteuid()
        uid = request.scope.get(PEER_UID)
        return int(uid) if uid is not None else os.geteuid()

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_: Request, __: Exception) -> JSONResponse:
        return JSONResponse(
            {"error": "Unauthorized", "message": "a bearer token is needed (GPUPOOL_TOKEN)"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(GpupoolError)
    async def gpupool_error(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, GpupoolError)
        body = {"error": type(err).__name__, "message": str(err)}
        return JSONResponse(body, status_code=err.http_status)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestValidationError)
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"invalid request: {where}: {first.get('msg', 'malformed')}"
        return JSONResponse({"error": "InvalidRequest", "message": message}, status_code=400)

    def with_live(job: Job) -> dict[str, Any]:
        data = job.to_json()
        live = agent.live(job.id)
        data["live_memory"] = live.memory if live else None
        data["utilization"] = live.utilization if live else None
        data["over_share"] = job.id in agent.watchdog.flagged
        data["mps_server"] = agent.mps_jobs.server_pid(job)
        return data

    @app.get("/v1/health")
    def health(_: int = Depends(caller)) -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    @app.get("/v1/jobs")
    def list_jobs(all: bool = False, _: int = Depends(caller)) -> dict[str, Any]:
        return {"jobs": [with_live(job) for job in agent.jobs(everything=all)]}

    # async: a submit is a few hundred microseconds of work, less than a hop to the thread pool
    @app.post("/v1/jobs", status_code=201)
    async def submit(body: SubmitBody, uid: int = Depends(caller)) -> dict[str, Any]:
        return {"job": agent.submit(_spec(body), uid, _user(uid)).to_json()}

    @app.get("/v1/jobs/{job_id}")
    def describe(job_id: int, _: int = Depends(caller)) -> dict[str, Any]:
        data = agent.describe(job_id)
        data["mps_server"] = agent.mps_jobs.server_pid(agent.job(job_id))
        live = agent.live(job_id)
        data["live_memory"] = live.memory if live else None
        data["utilization"] = live.utilization if live else None
        data["over_share"] = job_id in agent.watchdog.flagged
        return data

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: int, uid: int = Depends(caller)) -> dict[str, Any]:
        return {"job": agent.cancel(job_id, uid, _user(uid)).to_json()}

    @app.get("/v1/jobs/{job_id}/logs")
    def logs(
        job_id: int, stream: str = "stdout", offset: int = 0, _: int = Depends(caller)
    ) -> dict[str, Any]:
        job = agent.job(job_id)
        if stream not in ("stdout", "stderr"):
            raise InvalidRequest(f"unknown stream {stream!r}: use stdout or stderr")
        path = agent.jobdir(job_id).log(stream)
        data = b""
        try:
            with path.open("rb") as source:
                source.seek(max(0, offset))
                data = source.read(LOG_CHUNK)
        except FileNotFoundError:
            pass
        return {
            "data": data.decode(errors="replace"),
            "offset": max(0, offset) + len(data),
            "finished": job.state.finished,
        }

    @app.post("/v1/drain")
    def drain(body: DrainBody, _: int = Depends(caller)) -> dict[str, Any]:
        agent.drain(body.on)
        return agent.node_json()

    @app.get("/v1/node")
    def node(_: int = Depends(caller)) -> dict[str, Any]:
        return agent.node_json()

    watchdog_routes.register(app, agent, caller)
    app.include_router(metrics_router(agent, caller))
    app.include_router(dashboard_router(agent, token, caller))
    return app


class _Unauthorized(Exception):
    """A TCP request without the right bearer token."""
