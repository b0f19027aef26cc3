"""A Slurm job's gpupool share: what its gres gives it on this node, and the files that hold it.

Slurm's own accounting is the admission: the Prolog (root, on the node, before the job's first
task) reads what slurmctld gave the job (`scontrol show job -d`: `GRES=shard:3(IDX:0)`), never
the job's environment, which is the user's. With M shards per GPU, K shards are K/M of the
GPU's memory (a hard limit) and K/M of its compute (a cap at the node's compute arbiter, the
same one the daemon's jobs and Kubernetes pods are held by); `gpu:N` is whole GPUs.

The share's files go to SHARES/<job id>/: `etc/ld.so.preload` and `etc/gpupool/shim.conf`, which
the SPANK plugin lays over each task's /etc in a mount namespace of its own (so no program of
the job can drop the library or change its share), `env` (the variables the job's programs need
to find their GPUs), `region/` (the job user's accounting region) and `share.json` (what the
node's tools show, and what the Epilog ends).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gpupool.agent.arbiters import NodeArbiter
from gpupool.core import settings
from gpupool.core.errors import GpupoolError, InvalidRequest
from gpupool.core.resources import Priority
from gpupool.core.units import MILLI_PER_GPU, format_bytes, parse_bytes
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.arbiter_control import Registration
from gpupool.isolation.launch import ComputePolicy, ShareLimits, share_env
from gpupool.isolation.libraries import SHIM_LIBRARY, SIM_DIR
from gpupool.k8s import hostfiles
from gpupool.k8s.inventory import GpuInfo, from_snapshot
from gpupool.slurm.gres import Gres

SHARE_RECORD = "share.json"
#: in a job's directory instead of its share: why it has none (the SPANK plugin says it)
REFUSED = "refused"


@dataclass(frozen=True)
class SlurmShare:
    """One job's share on this node, as share.json holds it."""

    slurm_job_id: int
    user: str
    uid: int
    gpus: tuple[int, ...]
    #: shards per GPU (0 for whole GPUs)
    shards: int
    shards_per_gpu: int
    memory: int
    compute_milli: int
    share_id: int = 0
    #: what the job asked with the SPANK plugin's options (None: the arbiter's default)
    priority: str | None = None
    policy: str = "cap"

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "gpus": list(self.gpus)}


def share_of(
    job_id: int,
    user: str,
    uid: int,
    gres: Gres,
    gpus: Mapping[int, GpuInfo],
    shards_per_gpu: int,
) -> SlurmShare:
    """The share `gres` means on this node's GPUs (InvalidRequest if the node has not them)."""
    kind, count, indices = gres
    missing = [i for i in indices if i not in gpus]
    if missing:
        raise InvalidRequest(
            f"job {job_id}: Slurm gave it GPU {missing[0]}, which this node does not have: "
            "gres.conf disagrees with the node's GPUs"
        )
    if kind == "gpu":
        memory = min(gpus[i].memory for i in indices)
        return SlurmShare(job_id, user, uid, indices, 0, shards_per_gpu, memory, MILLI_PER_GPU)
    if len(indices) != 1:
        raise InvalidRequest(f"job {job_id}: shards on {len(indices)} GPUs: use one GPU's shards")
    if not 0 < count <= shards_per_gpu:
        raise InvalidRequest(
            f"job {job_id}: {count} shards of a GPU that has {shards_per_gpu}: "
            "gres.conf disagrees with the node's gpupool settings"
        )
    memory = gpus[indices[0]].memory * count // shards_per_gpu
    compute = MILLI_PER_GPU * count // shards_per_gpu
    return SlurmShare(job_id, user, uid, indices, count, shards_per_gpu, memory, compute)


def narrowed(
    share: SlurmShare,
    priority: str | None,
    policy: str | None,
    memory: str | None,
    compute: str | None,
) -> SlurmShare:
    """`share` with what the job asked (--gpupool-*): InvalidRequest if it asks more than its
    shards give, or something that is no value of the option."""
    job = f"job {share.slurm_job_id}"
    for name, value, allowed in (
        ("priority", priority, {"high", "low"}),
        ("policy", policy, {"cap", "share"}),
    ):
        if value is not None and value not in allowed:
            raise InvalidRequest(
                f"{job}: invalid --gpupool-{name}={value}: {' or '.join(sorted(allowed))}"
            )
    if compute is not None and not (compute.isdigit() and 1 <= int(compute) <= 100):
        raise InvalidRequest(f"{job}: invalid --gpupool-compute={compute}: a percent from 1 to 100")
    limit = share.memory
    if memory is not None:
        limit = parse_bytes(memory)
        if not 0 < limit <= share.memory:
            raise InvalidRequest(
                f"{job}: --gpupool-memory={memory} is more than its shards give "
                f"({format_bytes(share.memory)} of GPU memory)"
            )
    milli = share.compute_milli
    if compute is not None:
        milli = int(compute) * MILLI_PER_GPU // 100
        if milli > share.compute_milli:
            raise InvalidRequest(
                f"{job}: --gpupool-compute={compute} is more than its shards give "
                f"({share.compute_milli * 100 // MILLI_PER_GPU} % of the GPU)"
            )
    return replace(
        share, memory=limit, compute_milli=milli, priority=priority, policy=policy or "cap"
    )


def node_gpus(snapshot: NodeSnapshot) -> dict[int, GpuInfo]:
    return {gpu.index: gpu for gpu in from_snapshot(snapshot)}


def _write(path: Path, text: str, mode: int, group: int = 0) -> None:
    path.write_text(text)
    os.chown(path, 0, group)
    os.chmod(path, mode)


def write_share(
    shares_dir: Path,
    share: SlurmShare,
    gid: int,
    gpus: Mapping[int, GpuInfo],
    arbiter: NodeArbiter,
    sim_node: Path | None,
) -> tuple[SlurmShare, Registration | None]:
    """Register the share with the node's arbiter (the daemon's) and write its files (see the
    module's doc); the share and its registration, if it has one (a whole GPU has none)."""
    lib = hostfiles.install(shares_dir / "lib")
    job_dir = shares_dir / str(share.slurm_job_id)
    shutil.rmtree(job_dir, ignore_errors=True)
    (job_dir / "etc" / "gpupool").mkdir(parents=True, mode=0o755)
    os.chmod(job_dir, 0o711)  # the paths inside are known: each file guards itself
    region = job_dir / "region"
    region.mkdir(mode=0o700)
    os.chown(region, share.uid, gid)
    limits = ShareLimits(
        share.gpus,
        share.memory,
        share.compute_milli,
        policy=ComputePolicy(share.policy),
        priority=Priority(share.priority) if share.priority else None,
    )
    env = share_env(limits, [gpus[i].memory for i in share.gpus], region / "region")
    registration = None
    if limits.arbitrated:
        name = arbiter.share_of(f"slurm {share.slurm_job_id}")
        registration = limits.registration(name, share.uid, {i: gpus[i].uuid for i in gpus})
        arbiter.register(registration)
        env[settings.ARBITER_DIR.name] = str(arbiter.directory)
        env[settings.ARBITER_SHARE.name] = name.setting
        share = SlurmShare(**{**asdict(share), "share_id": name.share_id})
    conf = "".join(f"{k}={v}\n" for k, v in env.items() if k.startswith("GPUPOOL_"))
    # the job's group reads it, nobody writes it: its arbiter key is the job's alone
    _write(job_dir / "etc" / "gpupool" / "shim.conf", conf, 0o440, gid)
    _write(job_dir / "etc" / "ld.so.preload", f"{lib / SHIM_LIBRARY}\n", 0o444)
    visible = {k: v for k, v in env.items() if k.startswith("CUDA_")}
    if sim_node is not None:
        visible[settings.SIM_NODE.name] = str(sim_node)
        visible["LD_LIBRARY_PATH"] = str(lib / SIM_DIR)
    _write(job_dir / "env", "".join(f"{k}={v}\n" for k, v in visible.items()), 0o444)
    _write(job_dir / SHARE_RECORD, json.dumps(share.to_json()), 0o444)
    return share, registration


def refuse(shares_dir: Path, job_id: int, why: str) -> None:
    """Record that job `job_id` gets no share on this node, and why: its tasks do not start."""
    job_dir = shares_dir / str(job_id)
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True, mode=0o755)
    _write(job_dir / REFUSED, f"{why}\n", 0o444)


def end_share(shares_dir: Path, job_id: int, arbiter: NodeArbiter) -> bool:
    """Unregister job `job_id`'s share and remove its files; whether it had one."""
    job_dir = shares_dir / str(job_id)
    share = read_share(job_dir)
    if share is not None and share.share_id:
        # an arbiter that went away took its shares along
        with contextlib.suppress(GpupoolError):
            arbiter.unregister(share.share_id)
    existed = job_dir.exists()
    shutil.rmtree(job_dir, ignore_errors=True)
    return existed


def read_share(job_dir: Path) -> SlurmShare | None:
    try:
        data = json.loads((job_dir / SHARE_RECORD).read_text())
        data["gpus"] = tuple(data["gpus"])
        return SlurmShare(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def list_shares(shares_dir: Path) -> list[SlurmShare]:
    """Every job's share on this node, by Slurm job id."""
    found = [read_share(p) for p in shares_dir.glob("[0-9]*")]
    return sorted((s for s in found if s is not None), key=lambda s: s.slurm_job_id)
