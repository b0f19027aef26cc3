"""A service: a command that serves HTTP on `$PORT`, its per-replica share and its scaling rules.

A service is stored as its `ServiceSpec` (checked here, once, at create and update) with its
owner; its replicas are ordinary jobs of the pool, one per replica, each with the share below,
admitted and placed by the queue like any other job (agent/service_manager.py keeps them up).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.agent.jobs import SERVICE_GROUP, JobSpec
from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, parse_memory_share

#: a service's name is the first segment of its URLs (`/NAME/...`): lower-case DNS-label words
NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
#: the most replicas a service may ask for: each one is a process and a port on this node
MAX_REPLICAS = 64
MAX_CONCURRENCY = 10_000
#: a model name a service answers for at the router's OpenAI API (the JSON body's `model`):
#: printable ASCII without spaces (`meta-llama/Llama-3.1-8B-Instruct`, `gpt-4o:mini`)
MODEL_NAME = re.compile(r"[\x21-\x7e]{1,128}")
#: the most model names one service may answer for
MAX_MODELS = 16
#: the first segment of the router's OpenAI API (`/v1/chat/completions`): no service's name
RESERVED_NAMES = frozenset({"v1"})
#: a health path is sent as is in a request line: printable ASCII, no space
HEALTH_PATH = re.compile(r"/[\x21-\x7e]{0,255}")
#: the modes a replica may run in: a share of a GPU beside other services
SERVICE_MODES = (Mode.SHIM, Mode.MPS)
#: seconds a stopping replica's requests may take before it is stopped anyway
DEFAULT_DRAIN_S = 30.0
#: a `high` (online) replica's lease at the compute arbiter next to other busy `high` shares of
#: its GPU, in microseconds: a request that arrives while another online service's runs waits
#: for at most this and the kernel in flight, not for the batch jobs' 20 ms window
LATENCY_SLICE_US = 2000
#: `--keep-alive -1`: resident for good, never parked, never swapped out for another service
KEEP_RESIDENT = -1.0


@dataclass(frozen=True)
class ServiceSpec:
    """What `gpupool service create` asked for, checked."""

    name: str
    argv: tuple[str, ...]
    min_replicas: int = 1
    max_replicas: int = 1
    memory: str | None = None
    compute: int = MILLI_PER_GPU
    mode: Mode = Mode.SHIM
    priority: Priority = Priority.HIGH
    #: requests in flight one replica takes; the autoscaler's target and the router's cap
    concurrency: int = 4
    #: seconds without a request after which a service with MIN 0 goes to zero replicas
    idle_s: float = 300.0
    #: seconds of lower load before replicas are taken away (scale-down's stable window)
    window_s: float = 30.0
    #: seconds a new replica has to answer its health check before it counts as failed
    ready_timeout_s: float = 120.0
    health: str = "/health"
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    #: the model names it answers for at the router's OpenAI API; none given: its own name
    models: tuple[str, ...] = ()
    #: seconds an idle replica stays resident after its last request (Ollama's keep_alive):
    #: None as `idle_s`; 0 parks it at once; KEEP_RESIDENT never (nor swaps it out)
    keep_alive_s: float | None = None

    @property
    def resident_s(self) -> float:
        """Seconds without a request after which a service with MIN 0 goes to zero (inf:
        never)."""
        if self.keep_alive_s is None:
            return self.idle_s
        return float("inf") if self.keep_alive_s == KEEP_RESIDENT else self.keep_alive_s

    @property
    def swappable(self) -> bool:
        """Whether its idle replicas may be parked for another service's (MIN 0, mode shim, not
        kept resident)."""
        return (
            self.min_replicas == 0 and self.mode is Mode.SHIM and self.keep_alive_s != KEEP_RESIDENT
        )

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names a request's `model` routes to it by (`models`, else its name)."""
        return self.models or (self.name,)

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise InvalidRequest(
                f"invalid service name {self.name[:60]!r}: 1 to 40 lower-case letters, digits "
                "and -, starting and ending with a letter or digit (it is the URL prefix /NAME/)"
            )
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise InvalidRequest(
                f"invalid replicas {self.min_replicas}..{self.max_replicas}: MIN must not be "
                "above MAX (MIN..MAX, e.g. 0..4)"
            )
        if not 1 <= self.max_replicas <= MAX_REPLICAS:
            raise InvalidRequest(
                f"invalid replicas ..{self.max_replicas}: MAX is 1 to {MAX_REPLICAS}"
            )
        if self.mode not in SERVICE_MODES:
            raise InvalidRequest(
                f"mode {self.mode.value} is not for services: a replica shares a GPU (shim or mps)"
            )
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise InvalidRequest(
                f"invalid --concurrency {self.concurrency}: 1 to {MAX_CONCURRENCY}"
            )
        for what, seconds in (("--idle", self.idle_s), ("--window", self.window_s)):
            if not 0 <= seconds <= 30 * 86400:  # NaN too
                raise InvalidRequest(f"invalid {what}: 0s to 30d")
        keep = self.keep_alive_s
        if keep is not None and keep != KEEP_RESIDENT and not 0 <= keep <= 30 * 86400:
            raise InvalidRequest("invalid --keep-alive: 0s to 30d, or -1 (resident for good)")
        if not 1 <= self.ready_timeout_s <= 86400:
            raise InvalidRequest("invalid --ready-timeout: 1s to 1d")
        if not HEALTH_PATH.fullmatch(self.health):
            raise InvalidRequest(
                f"invalid --health {self.health[:60]!r}: a path starting with /, printable "
                "ASCII without spaces"
            )
        if "PORT" in self.env:
            raise InvalidRequest("--env PORT: gpupool picks each replica's port")
        if self.memory is not None:
            parse_memory_share(self.memory)
        _check_models(self.models)
        self.replica(0)  # the share and the command, checked as a job's are

    def replica(self, port: int, index: int = 0) -> JobSpec:
        """The job that runs one replica on `port`."""
        return JobSpec(
            argv=self.argv,
            gpus=1,
            compute=self.compute,
            memory=self.memory,
            mode=self.mode,
            priority=self.priority,
            name=f"{self.name}/{index}",
            env={**self.env, "PORT": str(port)},
            workdir=self.workdir,
            # replicas of one service spread over GPUs where they can; services still pack
            spread_group=f"{SERVICE_GROUP}{self.name}",
            slice_us=LATENCY_SLICE_US if self.priority is Priority.HIGH else 0,
        )

    def scaled(self, low: int, high: int) -> ServiceSpec:
        return replace(self, min_replicas=low, max_replicas=high)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "memory": self.memory,
            "compute": self.compute,
            "mode": self.mode.value,
            "priority": self.priority.value,
            "concurrency": self.concurrency,
            "idle_s": self.idle_s,
            "window_s": self.window_s,
            "ready_timeout_s": self.ready_timeout_s,
            "health": self.health,
            "env": dict(self.env),
            "workdir": self.workdir,
            "models": list(self.models),
            "keep_alive_s": self.keep_alive_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServiceSpec:
        return cls(
            name=data["name"],
            argv=tuple(data["argv"]),
            min_replicas=int(data["min_replicas"]),
            max_replicas=int(data["max_replicas"]),
            memory=data["memory"],
            compute=int(data["compute"]),
            mode=Mode(data["mode"]),
            priority=Priority(data["priority"]),
            concurrency=int(data["concurrency"]),
            idle_s=float(data["idle_s"]),
            window_s=float(data["window_s"]),
            ready_timeout_s=float(data["ready_timeout_s"]),
            health=data["health"],
            env=dict(data["env"]),
            workdir=data["workdir"],
            models=tuple(data.get("models", ())),  # none in a spec stored before models
            keep_alive_s=_optional_float(data.get("keep_alive_s")),
        )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _check_models(models: tuple[str, ...]) -> None:
    if len(models) > MAX_MODELS:
        raise InvalidRequest(f"too many --model names ({len(models)}): at most {MAX_MODELS}")
    for model in models:
        if not isinstance(model, str) or not MODEL_NAME.fullmatch(model):
            raise InvalidRequest(
                f"invalid --model {str(model)[:60]!r}: 1 to 128 printable ASCII characters "
                "without spaces"
            )
    if len(set(models)) != len(models):
        raise InvalidRequest("a --model name given twice")


def parse_replicas(text: str) -> tuple[int, int]:
    """`2`, `1..4`, `0..8` -> (MIN, MAX)."""
    match = re.fullmatch(r"\s*(\d{1,4})\s*(?:\.\.\s*(\d{1,4})\s*)?", text)
    if match is None:
        raise InvalidRequest(f"invalid replicas {text[:40]!r}: use N or MIN..MAX, e.g. 0..4")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low > high:
        raise InvalidRequest(f"invalid replicas {text!r}: MIN ({low}) is above MAX ({high})")
    return low, high
