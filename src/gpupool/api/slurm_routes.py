"""GET /v1/slurm: the Slurm jobs' shares on this node (`gpupool ps` shows them).

The node's Prolog writes each share's record under the shares directory (slurm/shares.py); the
daemon, started with --slurm-shares, lists them. Like Slurm's own squeue, every user of the node
sees every job's share: its Slurm job id, user, GPUs, shards, memory and compute.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI

from gpupool.slurm.shares import list_shares


def register(app: FastAPI, shares_dir: Path, caller: Callable[..., Awaitable[int]]) -> None:
    """Add GET /v1/slurm to `app`."""

    @app.get("/v1/slurm")
    def slurm_shares(_: int = Depends(caller)) -> dict[str, Any]:
        return {"shares": [share.to_json() for share in list_shares(shares_dir)]}
