"""What a pod asks of gpupool, read from its containers' limits and its annotations.

A pod is handled as the API server's JSON (a dict): the extender receives it that way, and the
in-memory API and the official client both speak it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, format_bytes, parse_bytes
from gpupool.k8s import names

Pod = dict[str, Any]


@dataclass(frozen=True)
class GpuAsk:
    """`gpus` GPUs, each with `memory` bytes (None: in proportion to compute), `compute` milli."""

    gpus: int
    memory: int | None
    compute: int
    mode: Mode = Mode.SHIM
    priority: Priority = Priority.HIGH
    gpu_model: str | None = None
    mig_profile: str | None = None

    @property
    def exclusive(self) -> bool:
        """Whole GPUs that no other pod may share."""
        return self.mode is Mode.EXCLUSIVE

    def describe(self) -> str:
        memory = format_bytes(self.memory) if self.memory is not None else "proportional memory"
        return f"{self.gpus} GPU(s) with {memory} and {self.compute // 10}% compute each"


def pod_key(pod: Pod) -> str:
    """`namespace/name` of a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def pod_annotations(pod: Pod) -> dict[str, str]:
    """The pod's annotations (an empty dict when it has none)."""
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def _limits(pod: Pod) -> dict[str, str]:
    """gpupool's limits over the pod's containers; only one container may ask for them."""
    found: dict[str, str] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        limits = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        mine = {k: str(v) for k, v in limits.items() if k in names.RESOURCES}
        if mine and found:
            raise InvalidRequest(
                f"pod {pod_key(pod)}: only one container may ask for gpupool resources"
            )
        found = mine or found
    return found


def _count(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise InvalidRequest(f"invalid {names.RESOURCE_GPU} {text!r}: a whole number of GPUs")
    return int(text)


def _memory(text: str) -> int:
    if text.strip().startswith("-"):
        raise InvalidRequest(f"invalid {names.RESOURCE_MEMORY} {text!r}: must not be negative")
    size = parse_bytes(text)
    if size <= 0:
        raise InvalidRequest(f"invalid {names.RESOURCE_MEMORY} {text!r}: must be positive")
    return size


def _compute(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise InvalidRequest(f"invalid {names.RESOURCE_COMPUTE} {text!r}: a whole percent 1..100")
    percent = int(text)
    if not 1 <= percent <= 100:
        raise InvalidRequest(f"invalid {names.RESOURCE_COMPUTE} {text!r}: must be 1..100 percent")
    return percent * MILLI_PER_GPU // 100


def _enum(kind: type[Mode] | type[Priority], key: str, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError as err:
        allowed = ", ".join(m.value for m in kind)
        raise InvalidRequest(f"invalid annotation {key}={value!r}: use one of {allowed}") from err


def gpu_ask(pod: Pod) -> GpuAsk | None:
    """What the pod asks for; None for a pod that asks for no gpupool GPU."""
    limits = _limits(pod)
    if names.RESOURCE_GPU not in limits:
        if limits:
            raise InvalidRequest(
                f"pod {pod_key(pod)}: {', '.join(sorted(limits))} need {names.RESOURCE_GPU}"
            )
        return None
    gpus = _count(limits[names.RESOURCE_GPU])
    if gpus == 0:
        return None
    ann = pod_annotations(pod)
    mode = _enum(Mode, names.ANN_MODE, ann.get(names.ANN_MODE)) or Mode.SHIM
    priority = _enum(Priority, names.ANN_PRIORITY, ann.get(names.ANN_PRIORITY)) or Priority.HIGH
    memory_text = limits.get(names.RESOURCE_MEMORY)
    memory = _memory(memory_text) if memory_text is not None else None
    compute_text = limits.get(names.RESOURCE_COMPUTE)
    compute = _compute(compute_text) if compute_text is not None else MILLI_PER_GPU
    if mode is Mode.EXCLUSIVE and (compute < MILLI_PER_GPU or memory is not None):
        raise InvalidRequest(f"pod {pod_key(pod)}: mode exclusive takes whole GPUs, no share")
    if mode is Mode.MIG:
        raise InvalidRequest(f"pod {pod_key(pod)}: mode mig is not served on Kubernetes yet")
    return GpuAsk(
        gpus,
        memory,
        compute,
        mode,
        priority,
        ann.get(names.ANN_GPU_MODEL) or None,
        ann.get(names.ANN_MIG_PROFILE) or None,
    )


def _gpu_container(pod: Pod) -> dict[str, Any]:
    """The container that asks for gpupool.io/gpu (an empty dict when none does)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        if names.RESOURCE_GPU in {
            **(resources.get("requests") or {}),
            **(resources.get("limits") or {}),
        }:
            return dict(container)
    return {}


def gpu_count(pod: Pod) -> int:
    """The device-plugin slots the kubelet allocates for the pod (0: none, or not a count)."""
    resources = _gpu_container(pod).get("resources") or {}
    text = str(
        {**(resources.get("requests") or {}), **(resources.get("limits") or {})}.get(
            names.RESOURCE_GPU, "0"
        )
    )
    return int(text) if re.fullmatch(r"\s*\d+\s*", text) else 0


def container_owner(pod: Pod) -> tuple[int, int]:
    """(uid, gid) the gpupool container runs as: its securityContext, else the pod's, else root
    (an image's own USER is not visible here: a non-root image must say runAsUser)."""
    pod_ctx = (pod.get("spec") or {}).get("securityContext") or {}
    ctx = _gpu_container(pod).get("securityContext") or {}
    owner = []
    for key in ("runAsUser", "runAsGroup"):
        value = ctx.get(key, pod_ctx.get(key, 0))
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(f"pod {pod_key(pod)}: invalid securityContext.{key} {value!r}")
        owner.append(value)
    return owner[0], owner[1]
