"""What Allocate gives a container: the share's environment and the read-only files that hold it.

The same share a `gpupool exec` launch gets (isolation/'s share_env), but in a container the
workload must not be able to drop it: the interception library is named in /etc/ld.so.preload
and the share's settings are in /etc/gpupool/shim.conf, both mounted read-only; the library reads
that file instead of the environment. Both come from the host directory the plugin installed at
start (hostfiles), never from the plugin's image. The accounting region lives in a per-container
host directory, owned by the container's user and nobody else's to write, mounted read-write,
so the node sees every share's use. The node's trusted compute arbiter (the same one as the
host's shares: one per GPU per node) has its runtime directory mounted read-only into every
container: its lease socket and its views. The share's name and key there are in the read-only
settings, which only its container sees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core import settings
from gpupool.isolation.arbiter_control import ArbiterShare
from gpupool.isolation.launch import ShareLimits, share_env
from gpupool.isolation.libraries import SHIM_LIBRARY, SIM_DIR
from gpupool.k8s.hostfiles import CONTAINER_LIBRARY, PRELOAD
from gpupool.k8s.inventory import GpuInfo

CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_CONFIG = "/etc/gpupool/shim.conf"
CONTAINER_SHARE_DIR = "/var/run/gpupool/share"
CONTAINER_ARBITER_DIR = "/var/run/gpupool/arbiter"
#: under --simulate: the simulated driver and the simulated node's state
CONTAINER_SIM_DRIVER = "/usr/lib/gpupool/sim"
CONTAINER_SIM_NODE = "/var/run/gpupool/sim-node"
#: under --simulate the node lives here in the state dir, so that containers mount it from the host
SIM_NODE_DIR = "sim-node"
#: in a container's conf directory: the name of the installed library directory it mounts
LIBRARY_RECORD = "library"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerShare:
    """The environment and mounts of one container's share."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class ShareFiles:
    """Where the plugin keeps the host side of the containers' files."""

    state_dir: Path
    #: this version's installed files (hostfiles.install)
    lib_dir: Path
    #: where the container's paths are rooted: / in a container; a directory in the tests,
    #: which stand in for the container runtime's mounts with symbolic links
    container_root: Path = Path("/")

    def in_container(self, path: str) -> Path:
        return self.container_root / path.lstrip("/")

    def share_dirs(self, key: str, owner: tuple[int, int]) -> tuple[Path, Path]:
        """(config directory, region directory) of one container; fresh each time. The region
        is the container user's (`owner`: uid, gid) alone: it writes its region, never its
        settings; the parents let no other host user list them."""
        conf = self.state_dir / "conf" / key
        region = self.state_dir / "regions" / key
        for directory in (conf, region):
            directory.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
            os.chmod(directory.parent, 0o711)
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(mode=0o755 if directory is conf else 0o770)
        os.chown(region, *owner)
        os.chmod(region, 0o770)
        return conf, region

    def keys(self) -> set[str]:
        """The containers that have files here."""
        return {p.name for kind in ("conf", "regions") for p in (self.state_dir / kind).glob("*")}

    def libraries_allocated(self) -> set[str]:
        """The installed library directories (by name) of the containers that have files here."""
        names = set()
        for record in (self.state_dir / "conf").glob(f"*/{LIBRARY_RECORD}"):
            with contextlib.suppress(OSError):
                names.add(record.read_text().strip())
        return names

    def release(self, key: str) -> None:
        for kind in ("conf", "regions"):
            shutil.rmtree(self.state_dir / kind / key, ignore_errors=True)


def container_share(
    files: ShareFiles,
    key: str,
    limits: ShareLimits,
    gpus: Sequence[GpuInfo],
    sim_node: Path | None,
    owner: tuple[int, int] = (0, 0),
    arbiter: tuple[Path, ArbiterShare] | None = None,
) -> ContainerShare:
    """Write the container's shim.conf and return its environment and mounts; `arbiter`: the
    node arbiter's directory and the share's name there, once registered."""
    conf_dir, region_dir = files.share_dirs(key, owner)
    region = files.in_container(CONTAINER_SHARE_DIR) / "region"
    env = share_env(limits, [g.memory for g in gpus], region)
    if arbiter is not None:
        env[settings.ARBITER_DIR.name] = str(files.in_container(CONTAINER_ARBITER_DIR))
        env[settings.ARBITER_SHARE.name] = arbiter[1].setting
    conf = {k: v for k, v in env.items() if k.startswith("GPUPOOL_")}
    (conf_dir / "shim.conf").write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
    os.chmod(conf_dir / "shim.conf", 0o444)
    # which installed directory this container mounts, so that an upgrade's prune keeps it
    (conf_dir / LIBRARY_RECORD).write_text(f"{files.lib_dir.name}\n")
    mounts = [
        Mount(str(files.in_container(CONTAINER_LIBRARY)), str(files.lib_dir / SHIM_LIBRARY), True),
        Mount(str(files.in_container(CONTAINER_PRELOAD)), str(files.lib_dir / PRELOAD), True),
        Mount(str(files.in_container(CONTAINER_CONFIG)), str(conf_dir / "shim.conf"), True),
        Mount(str(files.in_container(CONTAINER_SHARE_DIR)), str(region_dir), False),
    ]
    if sim_node is None:
        # the container runtime shows only these GPUs; UUIDs name them whatever their ordinals
        uuids = ",".join(g.uuid for g in gpus)
        env["NVIDIA_VISIBLE_DEVICES"] = uuids
        env["CUDA_VISIBLE_DEVICES"] = uuids
    else:
        # no container runtime hides simulated GPUs: the simulated driver shows the node's
        # GPUs and CUDA_VISIBLE_DEVICES (NVML indices, from share_env) picks the pod's
        driver = files.in_container(CONTAINER_SIM_DRIVER)
        node = files.in_container(CONTAINER_SIM_NODE)
        env["GPUPOOL_SIM_NODE"] = str(node)
        env["LD_LIBRARY_PATH"] = str(driver)
        mounts.append(Mount(str(driver), str(files.lib_dir / SIM_DIR), True))
        mounts.append(Mount(str(node), str(sim_node), False))
    if arbiter is not None:
        # read-only: a socket there can still be connected to, and nothing else is the pod's
        container = str(files.in_container(CONTAINER_ARBITER_DIR))
        mounts.append(Mount(container, str(arbiter[0]), True))
    return ContainerShare(env, tuple(mounts))
