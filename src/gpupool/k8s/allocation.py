"""What Allocate gives a container: the share's environment and the read-only files that hold it.

The same share a `gpupool exec` launch gets (isolation/'s share_env), but in a container the
workload must not be able to drop it: the interception library is named in /etc/ld.so.preload
and the share's settings are in /etc/gpupool/shim.conf, both mounted read-only; the library reads
that file instead of the environment. The accounting region lives in a per-container host
directory, mounted read-write, so the node sees every share's use. The node's trusted compute
arbiter (the same one as the host's shares: one per GPU per node) has its runtime directory
mounted read-only into every container: its lease socket and its views. The share's name and
key there are in the read-only settings, which only its container sees.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core import settings
from gpupool.isolation.arbiter_control import ArbiterShare
from gpupool.isolation.launch import ShareLimits, share_env
from gpupool.isolation.libraries import NATIVE_DIR, shim_library, sim_driver_dir
from gpupool.k8s.inventory import GpuInfo

CONTAINER_LIBRARY = "/usr/lib/gpupool/libgpupool-cuda.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_CONFIG = "/etc/gpupool/shim.conf"
CONTAINER_SHARE_DIR = "/var/run/gpupool/share"
CONTAINER_ARBITER_DIR = "/var/run/gpupool/arbiter"


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
    native_dir: Path = NATIVE_DIR
    #: where the container's paths are rooted: / in a container; a directory in the tests,
    #: which stand in for the container runtime's mounts with symbolic links
    container_root: Path = Path("/")

    def in_container(self, path: str) -> Path:
        return self.container_root / path.lstrip("/")

    def preload_file(self) -> Path:
        path = self.state_dir / "ld.so.preload"
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{files_library(self)}\n")
        return path

    def share_dirs(self, key: str) -> tuple[Path, Path]:
        """(config directory, region directory) of one container; fresh each time."""
        conf = self.state_dir / "conf" / key
        region = self.state_dir / "regions" / key
        for directory in (conf, region):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True, mode=0o700)
        # the workload may run as any user: it must write its region, never its settings
        os.chmod(region, 0o1777)
        return conf, region

    def keys(self) -> set[str]:
        """The containers that have files here."""
        return {p.name for kind in ("conf", "regions") for p in (self.state_dir / kind).glob("*")}

    def release(self, key: str) -> None:
        for kind in ("conf", "regions"):
            shutil.rmtree(self.state_dir / kind / key, ignore_errors=True)


def files_library(files: ShareFiles) -> str:
    """The library's path inside the container."""
    return str(files.in_container(CONTAINER_LIBRARY))


def container_share(
    files: ShareFiles,
    key: str,
    limits: ShareLimits,
    gpus: Sequence[GpuInfo],
    sim_node: Path | None,
    arbiter: tuple[Path, ArbiterShare] | None = None,
) -> ContainerShare:
    """Write the container's shim.conf and return its environment and mounts; `arbiter`: the
    node arbiter's directory and the share's name there, once registered."""
    conf_dir, region_dir = files.share_dirs(key)
    region = files.in_container(CONTAINER_SHARE_DIR) / "region"
    env = share_env(limits, [g.memory for g in gpus], region)
    if arbiter is not None:
        env[settings.ARBITER_DIR.name] = str(files.in_container(CONTAINER_ARBITER_DIR))
        env[settings.ARBITER_SHARE.name] = arbiter[1].setting
    conf = {k: v for k, v in env.items() if k.startswith("GPUPOOL_")}
    (conf_dir / "shim.conf").write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
    os.chmod(conf_dir / "shim.conf", 0o444)
    if sim_node is None:
        # the container runtime shows only these GPUs; UUIDs name them whatever their ordinals
        uuids = ",".join(g.uuid for g in gpus)
        env["NVIDIA_VISIBLE_DEVICES"] = uuids
        env["CUDA_VISIBLE_DEVICES"] = uuids
    else:
        env["GPUPOOL_SIM_NODE"] = str(sim_node)
        env["LD_LIBRARY_PATH"] = str(sim_driver_dir(files.native_dir))
    mounts: tuple[Mount, ...] = (
        Mount(files_library(files), str(shim_library(files.native_dir)), True),
        Mount(str(files.in_container(CONTAINER_PRELOAD)), str(files.preload_file()), True),
        Mount(str(files.in_container(CONTAINER_CONFIG)), str(conf_dir / "shim.conf"), True),
        Mount(str(files.in_container(CONTAINER_SHARE_DIR)), str(region_dir), False),
    )
    if arbiter is not None:
        # read-only: a socket there can still be connected to, and nothing else is the pod's
        container = str(files.in_container(CONTAINER_ARBITER_DIR))
        mounts += (Mount(container, str(arbiter[0]), True),)
    return ContainerShare(env, mounts)
