"""Simulated node specs: `8xH100-80GB`, `4xA30,2xA100-40GB` or a YAML inventory file.

The YAML inventory::

    gpus:
      - model: H100-80GB        # a catalog model or alias (H100, A30, H200, B200, ...)
        count: 2                # default 1
        mig: [3g.40gb, {profile: 4g.40gb, start: 0}]   # optional: MIG on, these instances;
                                                        # `mig: true` is MIG on, no instances
        uuids: [GPU-..., GPU-...]                       # optional, one per GPU
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.core import settings
from gpupool.core.errors import ConfigError, DeviceError, InvalidRequest, not_utf8
from gpupool.devices.sim.state import MAX_GPUS
from gpupool.mig import catalog

ENV_NODE_DIR = settings.SIM_NODE.name
_ITEM = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


@dataclass(frozen=True)
class HostLink:
    """A GPU's link to host memory: what a copy between the GPU and the host crosses."""

    name: str
    bytes_per_s: int


_GB = 10**9
PCIE_GEN4 = HostLink("PCIe gen4 x16", 25 * _GB)  # 32 GB/s raw, about 25 GB/s of copies
PCIE_GEN5 = HostLink("PCIe gen5 x16", 50 * _GB)  # 64 GB/s raw, about 50 GB/s of copies
NVLINK_C2C = HostLink("NVLink-C2C", 450 * _GB)  # Grace Hopper: 900 GB/s, 450 each way

#: each simulated model's host link: suspend, resume and managed memory's migrations are charged
#: at this bandwidth by the simulated driver
HOST_LINKS: dict[str, HostLink] = {
    "A30-24GB": PCIE_GEN4,
    "A100-40GB": PCIE_GEN4,
    "A100-80GB": PCIE_GEN4,
    "H100-80GB": PCIE_GEN5,
    "H100-94GB": PCIE_GEN5,
    "H200-141GB": PCIE_GEN5,
    "B200-180GB": PCIE_GEN5,
    "GH200-96GB": NVLINK_C2C,
}


def host_link(model: str) -> HostLink:
    """The host link of simulated model `model` (PCIe gen4 for a model the table lacks)."""
    return HOST_LINKS.get(model, PCIE_GEN4)


@dataclass(frozen=True)
class MigRequest:
    """An instance a spec asks for: a profile, at `start` or the first free valid slot."""

    profile: str
    start: int | None = None


@dataclass(frozen=True)
class GpuEntry:
    """One GPU of a spec."""

    model: catalog.GpuModel
    mig: bool = False
    instances: tuple[MigRequest, ...] = ()
    uuid: str | None = None


@dataclass(frozen=True)
class NodeSpec:
    """A parsed spec; `key` identifies it (the same spec reuses the same node)."""

    text: str
    gpus: tuple[GpuEntry, ...]

    @property
    def key(self) -> str:
        canonical = json.dumps(
            [
                [g.model.name, g.mig, [[i.profile, i.start] for i in g.instances], g.uuid]
                for g in self.gpus
            ]
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def parse_spec(text: str) -> NodeSpec:
    """A spec string or a YAML inventory path -> NodeSpec; bad input names the bad part."""
    stripped = text.strip()
    # a path, never a bare word: a file called `A30` in the working directory changes nothing
    if stripped.endswith((".yaml", ".yml")) or os.sep in stripped:
        return _parse_yaml(Path(stripped))
    gpus: list[GpuEntry] = []
    for part in stripped.split(","):
        match = _ITEM.match(part)
        if match is None:
            raise InvalidRequest(
                f"invalid simulated node spec {text!r}: {part.strip()!r} is not COUNTxMODEL "
                "(e.g. 8xH100-80GB, 4xA30,2xA100-40GB) nor a YAML file"
            )
        count = int(match.group(1) or 1)
        if count < 1:
            raise InvalidRequest(f"invalid simulated node spec {text!r}: GPU count {count}")
        gpus.extend([GpuEntry(catalog.get_model(match.group(2)))] * count)
    return NodeSpec(stripped, _check_size(text, gpus))


def _check_size(where: str, gpus: list[GpuEntry]) -> tuple[GpuEntry, ...]:
    if not 0 < len(gpus) <= MAX_GPUS:
        raise InvalidRequest(
            f"simulated node {where!r} has {len(gpus)} GPUs; a node holds 1 to {MAX_GPUS}"
        )
    return tuple(gpus)


def _load_yaml(path: Path) -> Any:
    import yaml  # here: a spec given by name (2xA100) must not pay for PyYAML's import

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read inventory {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise not_utf8(str(path), err) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{line} malformed YAML: {err.problem}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: malformed YAML: {err}") from err


def _parse_yaml(path: Path) -> NodeSpec:
    data = _load_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ConfigError(f"{path}: an inventory is a mapping with a `gpus:` list")
    gpus: list[GpuEntry] = []
    for number, item in enumerate(data["gpus"], start=1):
        gpus.extend(_parse_yaml_entry(path, number, item))
    return NodeSpec(str(path), _check_size(str(path), gpus))


def _parse_yaml_entry(path: Path, number: int, item: Any) -> list[GpuEntry]:
    where = f"{path}: gpus entry {number}"
    if not isinstance(item, dict) or "model" not in item:
        raise ConfigError(f"{where}: needs `model:` (and optionally count, mig, uuids)")
    unknown = set(item) - {"model", "count", "mig", "uuids"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    try:
        model = catalog.get_model(str(item["model"]))
    except InvalidRequest as err:
        raise ConfigError(f"{where}: {err}") from err
    count = item.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{where}: count {count!r} must be a positive integer")
    mig, instances = _parse_mig(where, model, item.get("mig", False))
    uuids = item.get("uuids")
    if uuids is not None and (
        not isinstance(uuids, list) or len(uuids) != count or not all(map(_is_gpu_uuid, uuids))
    ):
        raise ConfigError(f"{where}: uuids must list {count} UUIDs like GPU-<uuid>")
    return [
        GpuEntry(model, mig, instances, uuids[i] if uuids is not None else None)
        for i in range(count)
    ]


def _is_gpu_uuid(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"GPU-[0-9a-fA-F-]{36}", value) is not None


def _parse_mig(
    where: str, model: catalog.GpuModel, value: Any
) -> tuple[bool, tuple[MigRequest, ...]]:
    if isinstance(value, bool):
        return value, ()
    if not isinstance(value, list):
        raise ConfigError(f"{where}: mig must be true, false or a list of profiles")
    requests = []
    for item in value:
        profile, start = (item, None) if isinstance(item, str) else _mig_item(where, item)
        try:
            model.profile(profile)
        except InvalidRequest as err:
            raise ConfigError(f"{where}: {err}") from err
        requests.append(MigRequest(model.profile(profile).name, start))
    return True, tuple(requests)


def _mig_item(where: str, item: Any) -> tuple[str, int | None]:
    if not isinstance(item, dict) or not isinstance(item.get("profile"), str):
        raise ConfigError(f"{where}: a mig item is a profile name or {{profile: P, start: N}}")
    start = item.get("start")
    if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
        raise ConfigError(f"{where}: start {start!r} must be an integer slot")
    return item["profile"], start


#: a user's own simulated nodes are theirs alone
USER_BASE_MODE = 0o700
#: root's are the node's, as a root daemon serves every user of its socket group: their jobs
#: reach the node's state file by its path, as every user opens a real node's /dev/nvidia*;
#: nobody else can list, add or remove anything in it
ROOT_BASE_MODE = 0o711


def default_node_dir(spec: NodeSpec) -> Path:
    """Where the node of `spec` lives unless told: one directory per spec, per user."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "gpupool-sim" if runtime else Path(f"/tmp/gpupool-sim-{os.getuid()}")
    return _own(base, ROOT_BASE_MODE if os.geteuid() == 0 else USER_BASE_MODE) / spec.key


def _own(base: Path, mode: int) -> Path:
    """`base` with `mode`, created if new; refused when another user could have planted it (in
    /tmp). One an earlier gpupool made 0700 for root gets its mode now."""
    try:
        base.mkdir(mode=mode, parents=True, exist_ok=True)
        info = base.lstat()
    except OSError as err:
        raise DeviceError(f"cannot create simulated node directory {base}: {err}") from err
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise DeviceError(
            f"{base} is not a directory of this user: remove it, or use --node-dir DIR"
        )
    if stat.S_IMODE(info.st_mode) != mode:
        try:
            fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as err:
            raise DeviceError(f"cannot open simulated node directory {base}: {err}") from err
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return base


def resolve_node_dir(spec: NodeSpec | None, node_dir: Path | None) -> Path | None:
    """--node-dir, else $GPUPOOL_SIM_NODE, else the spec's default; None when nothing says.
    Absolute: the path goes into the environment of processes that run elsewhere."""
    if node_dir is not None:
        return node_dir.absolute()
    from_env = settings.SIM_NODE.read(os.environ)
    if from_env:
        return Path(from_env).absolute()
    return default_node_dir(spec) if spec is not None else None
