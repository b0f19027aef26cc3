"""/v1/services: create, list, describe, scale, update, delete a service, and read its logs.

Anyone on the node sees every service's share, replicas and traffic; its command, environment
and logs are its owner's and the admins', as a job's are. Changes go through the agent's service
manager, which checks who may make them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from gpupool.agent.access import user_name
from gpupool.agent.agent import Agent
from gpupool.agent.services import ServiceSpec
from gpupool.api.params import LOG_CHUNK, LogOffset
from gpupool.core.errors import InvalidRequest, NotFound, PermissionDenied
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import parse_compute_percent


class ServiceBody(BaseModel):
    """A service as `gpupool service create` sends it (durations in seconds)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    argv: list[str] = Field(min_length=1)
    min_replicas: int = Field(1, ge=0, le=10_000)
    max_replicas: int = Field(1, ge=0, le=10_000)
    memory: str | None = None
    compute: float = Field(100.0, description="percent of the GPU, a whole number from 1 to 100")
    mode: str = "shim"
    priority: str = "high"
    concurrency: int = Field(4, ge=1, le=1_000_000)
    idle_s: float = Field(300.0, allow_inf_nan=False)
    window_s: float = Field(30.0, allow_inf_nan=False)
    ready_timeout_s: float = Field(120.0, allow_inf_nan=False)
    health: str = "/health"
    env: dict[str, str] = {}
    workdir: str = "/"
    models: list[str] = Field([], max_length=64)
    keep_alive_s: float | None = Field(None, allow_inf_nan=False)


class UpdateBody(BaseModel):
    """What `service update` changes; what it leaves out stays as it is."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] | None = Field(None, min_length=1)
    memory: str | None = None
    compute: float | None = None
    mode: str | None = None
    priority: str | None = None
    concurrency: int | None = Field(None, ge=1, le=1_000_000)
    idle_s: float | None = Field(None, allow_inf_nan=False)
    window_s: float | None = Field(None, allow_inf_nan=False)
    ready_timeout_s: float | None = Field(None, allow_inf_nan=False)
    health: str | None = None
    env: dict[str, str] | None = None
    workdir: str | None = None
    models: list[str] | None = Field(None, max_length=64)
    keep_alive_s: float | None = Field(None, allow_inf_nan=False)


class ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(ge=0, le=10_000)
    max_replicas: int = Field(ge=0, le=10_000)


class EmptyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _mode(text: str) -> Mode:
    try:
        return Mode(text)
    except ValueError:
        raise InvalidRequest(f"unknown mode {text[:20]!r}: use shim or mps") from None


def _priority(text: str) -> Priority:
    try:
        return Priority(text)
    except ValueError:
        raise InvalidRequest(f"unknown priority {text[:20]!r}: use high or low") from None


def spec_of(body: ServiceBody) -> ServiceSpec:
    return ServiceSpec(
        name=body.name,
        argv=tuple(body.argv),
        min_replicas=body.min_replicas,
        max_replicas=body.max_replicas,
        memory=body.memory,
        compute=parse_compute_percent(body.compute),
        mode=_mode(body.mode),
        priority=_priority(body.priority),
        concurrency=body.concurrency,
        idle_s=body.idle_s,
        window_s=body.window_s,
        ready_timeout_s=body.ready_timeout_s,
        health=body.health,
        env=dict(body.env),
        workdir=body.workdir,
        models=tuple(body.models),
        keep_alive_s=body.keep_alive_s,
    )


def updated(spec: ServiceSpec, body: UpdateBody) -> ServiceSpec:
    """`spec` with what `body` gives changed, checked again as a whole."""
    data = spec.to_json()
    for key, value in body.model_dump(exclude_unset=True).items():
        if value is None:
            continue
        if key == "compute":
            value = parse_compute_percent(value)
        data[key] = value
    _mode(str(data["mode"]))
    _priority(str(data["priority"]))
    return ServiceSpec.from_json(data)


def register(app: FastAPI, agent: Agent, caller: Callable[..., Awaitable[int]]) -> None:
    """Add the /v1/services routes to `app`."""
    view = agent.view
    access = view.access

    @app.get("/v1/services")
    def list_services(_: int = Depends(caller)) -> dict[str, Any]:
        return {"services": [service.summary() for service in agent.services.services()]}

    @app.post("/v1/services", status_code=201)
    def create(body: ServiceBody, uid: int = Depends(caller)) -> dict[str, Any]:
        return {"service": agent.services.create(spec_of(body), uid, user_name(uid))}

    @app.get("/v1/services/{name}")
    def describe(name: str, uid: int = Depends(caller)) -> dict[str, Any]:
        return agent.services.describe(name, partial(access.may_see, uid))

    @app.post("/v1/services/{name}/scale")
    def scale(name: str, body: ScaleBody, uid: int = Depends(caller)) -> dict[str, Any]:
        if body.min_replicas > body.max_replicas:
            raise InvalidRequest(
                f"invalid replicas {body.min_replicas}..{body.max_replicas}: MIN is above MAX"
            )
        spec = agent.services.get(name).spec.scaled(body.min_replicas, body.max_replicas)
        return {"service": agent.services.scale(name, spec.min_replicas, spec.max_replicas, uid)}

    @app.post("/v1/services/{name}/update")
    def update(name: str, body: UpdateBody, uid: int = Depends(caller)) -> dict[str, Any]:
        spec = updated(agent.services.get(name).spec, body)
        return {"service": agent.services.update(name, spec, uid)}

    @app.delete("/v1/services/{name}")
    def delete(name: str, _: EmptyBody, uid: int = Depends(caller)) -> dict[str, Any]:
        return {"service": agent.services.delete(name, uid)}

    @app.get("/v1/services/{name}/logs")
    def logs(
        name: str,
        replica: int | None = None,
        stream: str = "stdout",
        offset: LogOffset = 0,
        uid: int = Depends(caller),
    ) -> dict[str, Any]:
        """A replica's log (the lowest-numbered one unless `replica` says), as a job's."""
        data = agent.services.describe(name, partial(access.may_see, uid))
        if not access.may_see(uid, int(data["uid"])):
            raise PermissionDenied(
                f"service {name} belongs to {data['user']}: only they or an admin may read its logs"
            )
        # a replica now, else the last one that ended (a crashing one's output is wanted most)
        found = [(r["index"], r["job_id"]) for r in data["replica_list"]]
        found += [(int(index), job) for index, job in data["ended"].items()]
        chosen = [(index, job) for index, job in found if replica is None or index == replica]
        if not chosen:
            which = "no replicas" if replica is None else f"no replica {replica}"
            raise NotFound(f"service {name} has {which} (gpupool service describe {name})")
        index, job_id = chosen[0]
        job = view.job(job_id)
        chunk, start = view.read_log(job_id, stream, offset, LOG_CHUNK)
        return {
            "job_id": job_id,
            "replica": index,
            "data": chunk.decode(errors="replace"),
            "offset": start + len(chunk),
            "finished": job.state.finished,
        }
