"""The allocation the extender writes on a pod at bind, signed so that nobody else can write one.

A pod's creator may write any annotation, so the device plugin cannot trust the allocation
annotations as such: the extender signs them (HMAC-SHA256 with a key that only the extender and
the device plugins hold, from one Secret) over every value and the pod's UID. A pod created with
forged annotations, another pod's annotations copied onto it, or a pod re-created under the same
name (a new UID) carries no valid signature, and Allocate refuses it.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.k8s import names
from gpupool.k8s.podspec import Pod, pod_annotations, pod_key

#: where the manifests mount the Secret gpupool-allocation-key into the extender and the plugin
DEFAULT_KEY_FILE = Path("/etc/gpupool/allocation-key/key")
#: bytes: shorter keys are refused (a guessable key would let anyone sign a share)
MIN_KEY_BYTES = 32
_VERSION = "gpupool-allocation-v1"


def slot_id(uuid: str, slot: int) -> str:
    """The device-plugin ID of slot `slot` of the GPU `uuid`."""
    return f"{uuid}::{slot}"


def slot_gpu(device: str) -> str:
    """The UUID of the GPU a slot ID is on."""
    return device.split("::", 1)[0]


@dataclass(frozen=True)
class Allocation:
    """What one pod holds on its node: GPU indices, the slot on each, memory and compute."""

    uid: str
    node: str
    gpus: tuple[int, ...]
    slots: tuple[str, ...]
    memory: int
    compute: int
    mode: Mode
    priority: Priority

    def _values(self) -> dict[str, str]:
        return {
            names.ANN_NODE: self.node,
            names.ANN_GPUS: ",".join(str(g) for g in self.gpus),
            names.ANN_SLOTS: ",".join(self.slots),
            names.ANN_MEMORY_BYTES: str(self.memory),
            names.ANN_COMPUTE_MILLI: str(self.compute),
        }

    def signature(self, key: bytes) -> str:
        # one value per line in a fixed order; no value may hold a newline (checked on read)
        values = self._values()
        fields = [
            _VERSION,
            self.uid,
            *(values[k] for k in sorted(values)),
            self.mode.value,
            self.priority.value,
        ]
        return hmac.new(key, "\n".join(fields).encode(), hashlib.sha256).hexdigest()

    def annotations(self, key: bytes) -> dict[str, str]:
        """The annotations the extender writes (mode and priority stay the pod's own
        annotations: signed, not written)."""
        return {**self._values(), names.ANN_SIGNATURE: self.signature(key)}


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(","))
    if any(v < 0 for v in values):
        raise ValueError(f"negative value in {text!r}")
    return values


def _parse(pod: Pod, ann: dict[str, str]) -> Allocation:
    meta = pod.get("metadata") or {}
    try:
        if any("\n" in ann.get(k, "") for k in names.ALLOCATION_ANNOTATIONS):
            raise ValueError("a value holds a newline")
        gpus = _ints(ann[names.ANN_GPUS])
        slots = tuple(ann[names.ANN_SLOTS].split(","))
        if len(slots) != len(gpus) or len(set(gpus)) != len(gpus):
            raise ValueError("one slot per distinct GPU")
        return Allocation(
            str(meta.get("uid") or ""),
            ann[names.ANN_NODE],
            gpus,
            slots,
            int(ann[names.ANN_MEMORY_BYTES]),
            int(ann[names.ANN_COMPUTE_MILLI]),
            Mode(ann.get(names.ANN_MODE, Mode.SHIM.value)),
            Priority(ann.get(names.ANN_PRIORITY, Priority.HIGH.value)),
        )
    except (KeyError, ValueError) as err:
        raise InvalidRequest(f"pod {pod_key(pod)}: malformed gpupool allocation: {err}") from err


def placed(pod: Pod) -> bool:
    """Whether the pod carries an allocation (valid or not)."""
    return names.ANN_GPUS in pod_annotations(pod)


def read_allocation(pod: Pod, key: bytes) -> Allocation:
    """The pod's allocation if the extender wrote it for this pod; InvalidRequest saying why not."""
    ann = pod_annotations(pod)
    if not placed(pod):
        raise InvalidRequest(
            f"pod {pod_key(pod)} carries no gpupool allocation: "
            f"was it scheduled by {names.SCHEDULER_NAME}?"
        )
    allocation = _parse(pod, ann)
    signature = ann.get(names.ANN_SIGNATURE, "")
    if not allocation.uid or not hmac.compare_digest(signature, allocation.signature(key)):
        raise InvalidRequest(
            f"pod {pod_key(pod)}: its gpupool allocation was not written by the gpupool "
            "extender for this pod (forged or copied annotations, or the pod was re-created "
            "with a new UID): refused"
        )
    return allocation


def allocated_mark(key: bytes, allocation: Allocation) -> str:
    """The value of ANN_ALLOCATED the device plugin writes once Allocate served `allocation`
    (signed too: a pod that marks itself served would hide from the check for waiting pods)."""
    return hmac.new(
        key, f"{_VERSION}\nallocated\n{allocation.signature(key)}".encode(), hashlib.sha256
    ).hexdigest()


def waiting(pod: Pod, key: bytes) -> bool:
    """Whether the kubelet may still admit the pod: not started, and no Allocate served it."""
    phase = (pod.get("status") or {}).get("phase")
    if phase not in (None, "", "Pending"):
        return False
    mark = pod_annotations(pod).get(names.ANN_ALLOCATED)
    if mark is None:
        return True
    try:
        allocation = read_allocation(pod, key)
    except InvalidRequest:
        return True
    return not hmac.compare_digest(mark, allocated_mark(key, allocation))


def load_key(path: Path) -> bytes:
    """The signing key in `path` (the mounted Secret); ConfigError saying how to make one."""
    try:
        key = path.read_bytes().strip()
    except OSError as err:
        raise ConfigError(
            f"cannot read the allocation key {path}: {err.strerror}; create the Secret "
            "gpupool-allocation-key (see docs/kubernetes.md)"
        ) from err
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"the allocation key {path} is {len(key)} bytes: use at least {MIN_KEY_BYTES} "
            "random bytes (head -c 48 /dev/urandom | base64)"
        )
    return key
