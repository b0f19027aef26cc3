"""A job: what was submitted (`JobSpec`), and what the store knows of it (`Job`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, MemoryShare, parse_memory_share
from gpupool.isolation.node import mig_label
from gpupool.scheduler.gpus import GpuRequest

#: the modes this daemon launches
LAUNCHABLE_MODES = (Mode.SHIM, Mode.EXCLUSIVE, Mode.MPS, Mode.MIG)
PRIORITY_RANK = {Priority.HIGH: 0, Priority.LOW: 1}


class State(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (State.QUEUED, State.RUNNING)


@dataclass(frozen=True)
class JobSpec:
    """A submission, checked: the share, the command, and who asked."""

    argv: tuple[str, ...]
    gpus: int = 1
    compute: int = MILLI_PER_GPU
    memory: str | None = None
    mode: Mode = Mode.SHIM
    priority: Priority = Priority.HIGH
    gpu_models: tuple[str, ...] = ()
    name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    #: mode mig: the profile of the MIG instance the job runs on (`1g.10gb`)
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        if not self.argv or not self.argv[0]:
            raise InvalidRequest("no command given: put it after `--`")
        if self.mode not in LAUNCHABLE_MODES:
            modes = ", ".join(m.value for m in LAUNCHABLE_MODES)
            raise InvalidRequest(f"mode {self.mode.value} is not available yet; use {modes}")
        if self.mode is Mode.EXCLUSIVE and (self.compute != MILLI_PER_GPU or self.memory):
            raise InvalidRequest("mode exclusive takes whole GPUs: drop --compute and --memory")
        if self.mode is Mode.MPS and self.gpus != 1:
            raise InvalidRequest(
                "mode mps runs a job on one GPU (a client joins one GPU's MPS server): use --gpus 1"
            )
        if (self.mode is Mode.MIG) != (self.mig_profile is not None):
            raise InvalidRequest("mode mig and --mig-profile go together: give the profile")
        if self.mode is Mode.MIG and self.gpus != 1:
            raise InvalidRequest("a MIG job runs on one MIG instance: drop --gpus")
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise InvalidRequest(f"invalid environment variable name {key!r}")
        if not self.workdir.startswith("/"):
            raise InvalidRequest(f"invalid working directory {self.workdir!r}: must be absolute")
        self.request()  # the share itself must be valid

    def memory_share(self) -> MemoryShare | None:
        return parse_memory_share(self.memory) if self.memory else None

    def request(self) -> GpuRequest:
        """The share as the scheduler sees it."""
        if self.mode is Mode.EXCLUSIVE:
            return GpuRequest.exclusive(self.gpus, self.gpu_models)
        return GpuRequest(self.gpus, self.compute, self.memory_share(), self.gpu_models)

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "gpus": self.gpus,
            "compute": self.compute,
            "memory": self.memory,
            "mode": self.mode.value,
            "priority": self.priority.value,
            "gpu_models": list(self.gpu_models),
            "name": self.name,
            "env": dict(self.env),
            "workdir": self.workdir,
            "mig_profile": self.mig_profile,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        return cls(
            argv=tuple(data["argv"]),
            gpus=data["gpus"],
            compute=data["compute"],
            memory=data["memory"],
            mode=Mode(data["mode"]),
            priority=Priority(data["priority"]),
            gpu_models=tuple(data["gpu_models"]),
            name=data["name"],
            env=dict(data["env"]),
            workdir=data["workdir"],
            mig_profile=data.get("mig_profile"),  # absent from jobs stored before MIG jobs
        )


@dataclass(frozen=True)
class MigUse:
    """The MIG instance a job runs on; `created`: the daemon made it for the job."""

    gpu: int
    gi_id: int
    profile: str
    start: int
    uuid: str
    memory_total: int
    created: bool

    @property
    def label(self) -> str:
        return mig_label(self.profile, self.gpu, self.gi_id)


@dataclass(frozen=True)
class Job:
    """A job as stored: its spec, owner, state, placement and outcome."""

    id: int
    spec: JobSpec
    uid: int
    user: str
    state: State
    submitted_at: float
    gpus: tuple[int, ...] = ()
    memory: tuple[int, ...] = ()  # bytes per GPU of `gpus`, resolved at placement
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    oom: bool = False
    peak_memory: int | None = None
    supervisor_pid: int | None = None
    supervisor_start: int | None = None
    job_pid: int | None = None
    cancel_requested: bool = False
    #: mode mig, once placed: its instance (from the store's MIG table)
    mig: MigUse | None = None

    @property
    def name(self) -> str:
        return self.spec.name or self.spec.argv[0].rsplit("/", 1)[-1]

    def memory_per_gpu(self) -> int | None:
        """Bytes on each GPU: as placed, else as asked when that is absolute."""
        if self.memory:
            return self.memory[0]
        share = self.spec.memory_share()
        return share.bytes if share is not None else None

    def to_json(self) -> dict[str, Any]:
        """The schema of `gpupool ps --json` (one job)."""
        return {
            "id": self.id,
            "name": self.name,
            "user": self.user,
            "uid": self.uid,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "gpus": list(self.gpus),
            "gpu_count": self.spec.gpus,
            "memory": self.memory_per_gpu(),
            "memory_request": self.spec.memory,
            "compute": round(self.spec.request().compute * 100 / MILLI_PER_GPU),
            "mode": self.spec.mode.value,
            "priority": self.spec.priority.value,
            "gpu_models": list(self.spec.gpu_models),
            "command": list(self.spec.argv),
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "oom": self.oom,
            "peak_memory": self.peak_memory,
            "mig_profile": self.spec.mig_profile,
            "mig": self.mig.label if self.mig is not None else None,
            "mig_uuid": self.mig.uuid if self.mig is not None else None,
        }


def queue_order(job: Job) -> tuple[int, int]:
    """A job's place in the queue: `high` before `low`, then by submission."""
    return (PRIORITY_RANK[job.spec.priority], job.id)
