"""A job: what was submitted (`JobSpec`), and what the store knows of it (`Job`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, MemoryShare, parse_bytes, parse_memory_share
from gpupool.isolation.arbiter_control import SLICE_MAX_US, SLICE_MIN_US
from gpupool.isolation.node import mig_label
from gpupool.scheduler.gpus import GpuRequest

#: the modes this daemon launches
LAUNCHABLE_MODES = (Mode.SHIM, Mode.EXCLUSIVE, Mode.MPS, Mode.MIG)
PRIORITY_RANK = {Priority.HIGH: 0, Priority.LOW: 1}

# The bounds of a submission (docs/limits.md): a job's name, command and environment are its
# owner's to choose, so none of them may be large enough to slow or bloat the daemon, whose every
# listing carries them. Sizes are UTF-8 bytes as execve(2) counts them (each string + its NUL).
MAX_NAME_CHARS = 128
MAX_ARGS = 1024
MAX_ARGV_BYTES = 128 * 1024
MAX_ENV_VARS = 256
MAX_ENV_BYTES = 128 * 1024
MAX_WORKDIR_BYTES = 4096  # PATH_MAX
MAX_GPU_MODELS = 16
#: a GPU model name, a memory quantity, a MIG profile
MAX_WORD_CHARS = 64
#: what a shell and execve(2) take as a variable name
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class State(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (State.QUEUED, State.RUNNING)


#: the spread group of a service's replicas, before its name (services.py)
SERVICE_GROUP = "service/"


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
    #: a low job's memory past its share, host-backed (`24Gi`; elastic memory)
    memory_burst: str | None = None
    #: jobs with the same group spread over GPUs where they can (a service's replicas; the
    #: engine's `avoid`, scheduler/gpu_placement.py); empty: none
    spread_group: str = ""
    #: its lease length at the node's compute arbiter next to busy shares of its priority, in
    #: microseconds (a `high` service replica's short slice, services.py); 0: the batch window
    slice_us: int = 0

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
        if self.slice_us != 0 and not SLICE_MIN_US <= self.slice_us <= SLICE_MAX_US:
            raise InvalidRequest(
                f"invalid time slice {self.slice_us} us: {SLICE_MIN_US} us to "
                f"{SLICE_MAX_US // 1000} ms"
            )
        self.check_bounds()
        self.request()  # the share itself must be valid
        self.burst_bytes()

    @property
    def service(self) -> str:
        """The service this job is a replica of; empty for a job of its own."""
        group = self.spread_group
        return group.removeprefix(SERVICE_GROUP) if group.startswith(SERVICE_GROUP) else ""

    def check_bounds(self) -> None:
        """InvalidRequest, naming the field, for text that is not valid UTF-8 or is too big."""
        _check_words(self)
        if len(self.name) > MAX_NAME_CHARS or not self.name.isprintable():
            _text("name", self.name)  # a lone surrogate is not printable: say that first
            raise InvalidRequest(
                f"invalid name {_shown(self.name)}: at most {MAX_NAME_CHARS} printable characters"
            )
        if len(self.argv) > MAX_ARGS:
            raise InvalidRequest(f"too many arguments ({len(self.argv)}): at most {MAX_ARGS}")
        size = sum(_c_string(f"argv[{i}]", arg) for i, arg in enumerate(self.argv))
        if size > MAX_ARGV_BYTES:
            raise InvalidRequest(f"the command is {size} bytes: at most {MAX_ARGV_BYTES}")
        if len(self.env) > MAX_ENV_VARS:
            raise InvalidRequest(
                f"too many environment variables ({len(self.env)}): at most {MAX_ENV_VARS}"
            )
        size = 0
        for key, value in self.env.items():
            _text("an environment variable name", key)
            if not ENV_NAME.fullmatch(key):
                raise InvalidRequest(
                    f"invalid environment variable name {_shown(key)}: letters, digits and _, "
                    "not starting with a digit"
                )
            size += len(key) + 1 + _c_string(f"env[{key}]", value)
        if size > MAX_ENV_BYTES:
            raise InvalidRequest(f"the environment is {size} bytes: at most {MAX_ENV_BYTES}")
        if _c_string("workdir", self.workdir) > MAX_WORKDIR_BYTES or not self.workdir.startswith(
            "/"
        ):
            raise InvalidRequest(
                f"invalid working directory {_shown(self.workdir)}: an absolute path of at most "
                f"{MAX_WORKDIR_BYTES} bytes"
            )

    def burst_bytes(self) -> int:
        """The burst in bytes per GPU (0: none); InvalidRequest for a burst this job cannot
        have."""
        if not self.memory_burst:
            return 0
        if self.priority is not Priority.LOW:
            raise InvalidRequest(
                "--memory-burst is for low-priority jobs (a high job's memory is guaranteed: "
                "give it a larger --memory)"
            )
        if self.mode is not Mode.SHIM or not self.memory:
            raise InvalidRequest("--memory-burst needs mode shim and a --memory share")
        burst = parse_bytes(self.memory_burst)
        if burst <= 0:
            raise InvalidRequest(f"invalid --memory-burst {self.memory_burst!r}: must be above 0")
        return burst

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
            "memory_burst": self.memory_burst,
            "spread_group": self.spread_group,
            "slice_us": self.slice_us,
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
            memory_burst=data.get("memory_burst"),  # and before elastic memory
            spread_group=data.get("spread_group", ""),  # and before services spread
            slice_us=data.get("slice_us", 0),  # and before a replica's short slice
        )


def _shown(text: str, chars: int = 40) -> str:
    """`text` for an error line: quoted, escaped, and cut short (it may be megabytes)."""
    return repr(text[:chars]) + ("..." if len(text) > chars else "")


def _text(what: str, text: str) -> int:
    """The UTF-8 size of `text`, or InvalidRequest naming `field` for a lone surrogate (JSON's
    `\\ud800` escape decodes to one; no UTF-8 byte sequence encodes it)."""
    try:
        return len(text.encode())
    except UnicodeEncodeError as err:
        raise InvalidRequest(
            f"{what} is not valid UTF-8 text (a lone surrogate at character {err.start})"
        ) from None


def _c_string(what: str, text: str) -> int:
    """The bytes execve(2) takes for `text`: valid UTF-8 with no NUL, plus its NUL."""
    size = _text(what, text)
    if "\0" in text:
        raise InvalidRequest(f"{what} holds a NUL character, which no command can receive")
    return size + 1


def _check_words(spec: JobSpec) -> None:
    """The short fields: GPU models, the memory quantity, the MIG profile."""
    if len(spec.gpu_models) > MAX_GPU_MODELS:
        raise InvalidRequest(
            f"too many GPU models ({len(spec.gpu_models)}): at most {MAX_GPU_MODELS}"
        )
    words = [(f"gpu_models[{i}]", model) for i, model in enumerate(spec.gpu_models)]
    words += [("memory", spec.memory or ""), ("mig_profile", spec.mig_profile or "")]
    words += [("memory_burst", spec.memory_burst or ""), ("spread_group", spec.spread_group)]
    for what, word in words:
        _text(what, word)
        if len(word) > MAX_WORD_CHARS or not word.isprintable():
            raise InvalidRequest(
                f"invalid {what} {_shown(word)}: at most {MAX_WORD_CHARS} printable characters"
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
    #: why the stored spec cannot be read (a row an older gpupool let in): `spec` is then
    #: UNREADABLE_SPEC, so that listing it still works; the queue loop fails such a job
    unreadable: str | None = None

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
            "memory_burst": self.spec.burst_bytes() if self.spec.memory_burst else None,
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
            "unreadable": self.unreadable,
        }


#: the stand-in for a stored spec that cannot be read: one whole GPU, the most a job can hold
#: unnoticed, so a running one is not taken to leave room
UNREADABLE_SPEC = JobSpec(argv=("(unreadable)",), name="(unreadable)")


def queue_order(job: Job) -> tuple[int, int]:
    """A job's place in the queue: `high` before `low`, then by submission."""
    return (PRIORITY_RANK[job.spec.priority], job.id)
