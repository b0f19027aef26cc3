"""The launch spec of a share: the command and the environment that make it hold.

The interception library is preloaded and reads GPUPOOL_* once at load (limits per visible
device ordinal); CUDA_VISIBLE_DEVICES picks the GPUs; each invocation gets its own accounting
file (GPUPOOL_SHARED_REGION). On a simulated node the simulated driver comes first on the library
path and GPUPOOL_SIM_NODE names the node.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gpupool.core import settings
from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Priority
from gpupool.core.units import MILLI_PER_GPU, MemoryShare
from gpupool.isolation.arbiter_control import ArbiterShare, Registration
from gpupool.isolation.libraries import NATIVE_DIR, shim_library, sim_driver_dir


class ComputePolicy(StrEnum):
    """`cap`: never above the share; `share`: may use an idle GPU, back to the share under load."""

    CAP = "cap"
    SHARE = "share"


@dataclass(frozen=True)
class ShareLimits:
    """One share on a node: GPU indices, memory per GPU, compute per GPU, and its priority
    (None: arbitrated with other shares only when it has a compute limit)."""

    gpus: tuple[int, ...]
    memory: int | MemoryShare | None = None
    compute_milli: int = MILLI_PER_GPU
    policy: ComputePolicy = ComputePolicy.CAP
    priority: Priority | None = None
    #: the MIG instance the share runs on (its GPU is `gpus[0]`); CUDA shows a process one MIG
    #: device at most, so a share on an instance has exactly one
    mig_uuid: str | None = None
    #: its lease length at the arbiter next to busy shares of its priority, in microseconds (a
    #: latency-bound service's short slice); 0: the arbiter's batch window
    slice_us: int = 0

    @property
    def arbitrated(self) -> bool:
        """Whether the share takes leases from the GPU's arbiter (as the library decides)."""
        return self.compute_milli < MILLI_PER_GPU or self.priority is not None

    @property
    def percent(self) -> int:
        """Its compute in percent of a GPU, the arbiter's weight (at least 1)."""
        return max(1, min(100, round(self.compute_milli * 100 / MILLI_PER_GPU)))

    def registration(
        self, share: ArbiterShare, uid: int, uuids: Sequence[str] | Mapping[int, str]
    ) -> Registration:
        """What the arbiter holds the share to; `uuids`: the node's GPUs' UUIDs by index."""
        gpus = (self.mig_uuid,) if self.mig_uuid is not None else tuple(uuids[g] for g in self.gpus)
        priority = self.priority.value if self.priority is not None else None
        return Registration(
            share, uid, gpus, self.percent, priority, self.policy.value, self.slice_us
        )

    def __post_init__(self) -> None:
        if not self.gpus:
            raise InvalidRequest("invalid share: it needs at least one GPU")
        if self.mig_uuid is not None and len(self.gpus) != 1:
            raise InvalidRequest("a share on a MIG instance has exactly one GPU: its instance")
        if len(set(self.gpus)) != len(self.gpus) or min(self.gpus) < 0:
            raise InvalidRequest(f"invalid GPU indices {list(self.gpus)}: distinct, from 0")
        if not 0 < self.compute_milli <= MILLI_PER_GPU:
            raise InvalidRequest(
                f"invalid compute {self.compute_milli}: must be 1..{MILLI_PER_GPU} milli-GPU"
            )
        if isinstance(self.memory, int) and self.memory <= 0:
            raise InvalidRequest(f"invalid memory {self.memory}: must be positive")


@dataclass(frozen=True)
class LaunchSpec:
    """What to run and with which environment (the whole environment, not a delta)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    shared_region: Path | None = None


#: a share's settings come only from its launch: inherited limits would apply to the wrong
#: ordinals, an inherited settings file would override the share wholesale, and an inherited
#: arbiter share would be another share's name
_SHARE_VARIABLES = tuple(s.name for s in settings.SHARE_SETTINGS)


def memory_bytes(memory: int | MemoryShare | None, gpu_total: int | None) -> int | None:
    """A share's memory in bytes on a GPU of `gpu_total` bytes (a fraction needs the total)."""
    if memory is None or isinstance(memory, int):
        return memory
    if memory.bytes is not None:
        return memory.bytes
    if gpu_total is None:
        raise InvalidRequest(f"memory {memory} is a fraction: the GPU's total memory is unknown")
    return memory.resolve(gpu_total)


def _prepend_path(value: str, existing: str | None, sep: str) -> str:
    return value if not existing else f"{value}{sep}{existing}"


#: a share's private directory (one per launch), whose owner is the share's user
SHARE_DIR_PREFIX = "gpupool-share-"
_REGION_FILE = "region"


def new_shared_region(directory: Path | None = None) -> Path:
    """A fresh accounting file path inside a private (0700) directory; the library creates it."""
    private = Path(tempfile.mkdtemp(prefix=SHARE_DIR_PREFIX, dir=directory))
    return private / _REGION_FILE


def find_shared_region(directory: Path) -> Path | None:
    """The accounting file path new_shared_region(directory) gave; None if it gave none."""
    try:
        with os.scandir(directory) as entries:  # no glob: /metrics asks for every job
            for entry in entries:
                if entry.name.startswith(SHARE_DIR_PREFIX):
                    return Path(entry.path) / _REGION_FILE
    except OSError:
        pass
    return None


def share_env(
    limits: ShareLimits,
    gpu_totals: Sequence[int | None],
    shared_region: Path,
) -> dict[str, str]:
    """A share's GPUPOOL_* variables and CUDA_VISIBLE_DEVICES (docs/protocols/interception.md).

    `gpu_totals[i]` is the memory of `limits.gpus[i]` (of the MIG instance, on one); a limit is
    written per visible ordinal, since a fraction resolves to different bytes on GPUs of
    different sizes.
    """
    env = {
        # GPU indices are NVML's (PCI bus order); CUDA's own default order is fastest first
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": limits.mig_uuid or ",".join(str(g) for g in limits.gpus),
        "GPUPOOL_COMPUTE_POLICY": limits.policy.value,
        "GPUPOOL_SHARED_REGION": str(shared_region),
    }
    for ordinal, total in enumerate(gpu_totals):
        limit = memory_bytes(limits.memory, total)
        if limit is not None:
            env[f"GPUPOOL_MEMORY_LIMIT_{ordinal}"] = str(limit)
    if limits.priority is not None:
        env["GPUPOOL_COMPUTE_PRIORITY"] = limits.priority.value
    if limits.compute_milli < MILLI_PER_GPU:
        percent = max(1, round(limits.compute_milli * 100 / MILLI_PER_GPU))
        env["GPUPOOL_COMPUTE_LIMIT"] = str(percent)
    return env


def build_launch_spec(
    argv: Sequence[str],
    limits: ShareLimits,
    *,
    gpu_totals: Sequence[int | None] | None = None,
    sim_node: Path | None = None,
    base_env: Mapping[str, str] | None = None,
    shared_region: Path | None = None,
    native_dir: Path = NATIVE_DIR,
    arbiter: tuple[Path, ArbiterShare] | None = None,
) -> LaunchSpec:
    """The full launch spec for `argv` under `limits`; `sim_node` runs it on a simulated node;
    `arbiter`: the arbiter's directory and the share's name there, once registered."""
    if not argv:
        raise InvalidRequest("no command given: put it after `--`")
    totals = list(gpu_totals) if gpu_totals is not None else [None] * len(limits.gpus)
    if len(totals) != len(limits.gpus):
        raise InvalidRequest("one GPU total per GPU of the share is needed")
    env = dict(os.environ if base_env is None else base_env)
    # a share's settings come only from here: inherited limits would apply to the wrong
    # ordinals, an inherited settings file or arbiter directory to another share
    for name in [n for n in env if n.startswith(_SHARE_VARIABLES)]:
        del env[name]
    region = shared_region if shared_region is not None else new_shared_region()
    env.update(share_env(limits, totals, region))
    if arbiter is not None:
        env[settings.ARBITER_DIR.name] = str(arbiter[0])
        env[settings.ARBITER_SHARE.name] = arbiter[1].setting
    env["LD_PRELOAD"] = _prepend_path(str(shim_library(native_dir)), env.get("LD_PRELOAD"), ":")
    if sim_node is not None:
        sim_dir = str(sim_driver_dir(native_dir))
        env["LD_LIBRARY_PATH"] = _prepend_path(sim_dir, env.get("LD_LIBRARY_PATH"), ":")
        env["GPUPOOL_SIM_NODE"] = str(sim_node)
    return LaunchSpec(tuple(argv), env, region)
