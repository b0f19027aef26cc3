"""The Slurm node's routes (the daemon started with --slurm-shares): the Prolog and Epilog make
and end the jobs' shares through them (root only), and `gpupool ps` lists them.

Like Slurm's own squeue, every user of the node sees every job's share in GET /v1/slurm: its
Slurm job id, user, GPUs, shards, memory and compute.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from gpupool.agent.access import Access
from gpupool.agent.view import NodeView
from gpupool.slurm.node import Asked, SlurmNode


class PrologBody(BaseModel):
    """What slurmctld gave the job on this node (the Prolog read it with scontrol)."""

    model_config = ConfigDict(extra="forbid")
    job_id: int = Field(ge=1)
    uid: int = Field(ge=0)
    kind: Literal["shard", "gpu"]
    count: int = Field(ge=1)
    gpus: list[int] = Field(min_length=1, max_length=64)
    shards_per_gpu: int = Field(ge=1, le=100_000)
    #: the job's --gpupool-* options, as the user typed them (a job submitted past srun's own
    #: check may carry anything): checked here, a bad one refuses the job, not the Prolog
    priority: str | None = Field(default=None, max_length=64)
    policy: str | None = Field(default=None, max_length=64)
    memory: str | None = Field(default=None, max_length=64)
    compute: str | None = Field(default=None, max_length=64)


class EpilogBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: int = Field(ge=1)


def register(
    app: FastAPI,
    slurm: SlurmNode,
    view: NodeView,
    access: Access,
    caller: Callable[..., Awaitable[int]],
) -> None:
    """Add GET /v1/slurm, POST /v1/slurm/prolog and POST /v1/slurm/epilog to `app`."""

    @app.get("/v1/slurm")
    def slurm_shares(_: int = Depends(caller)) -> dict[str, Any]:
        return {"shares": slurm.listing()}

    @app.post("/v1/slurm/prolog")
    def prolog(body: PrologBody, uid: int = Depends(caller)) -> dict[str, Any]:
        access.require_admin(uid, "making a Slurm job's share")
        gres = (body.kind, body.count, tuple(body.gpus))
        asked = Asked(body.priority, body.policy, body.memory, body.compute)
        snapshot = view.snapshot()
        return slurm.start(body.job_id, body.uid, gres, body.shards_per_gpu, snapshot, asked)

    @app.post("/v1/slurm/epilog")
    def epilog(body: EpilogBody, uid: int = Depends(caller)) -> dict[str, Any]:
        access.require_admin(uid, "ending a Slurm job's share")
        return {"ended": slurm.end(body.job_id)}
