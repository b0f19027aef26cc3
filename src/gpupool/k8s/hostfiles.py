"""The files every container's share mounts, installed on the host by the device plugin at start.

The kubelet mounts host paths, not the plugin's image: the plugin copies the interception
library (and the simulated driver) from its package into `<lib root>/<version>-<digest>/` on the
host directory the DaemonSet shares, with the /etc/ld.so.preload that names it. A directory is
written once, under a temporary name, then renamed into place, and never changed afterwards: an
upgraded plugin installs beside it, so a running container keeps the files it started with;
the plugin removes an older directory once no container has it mounted or allocated (prune).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from gpupool import __version__
from gpupool.core.errors import ConfigError, NativeLibraryError
from gpupool.isolation.libraries import (
    NATIVE_DIR,
    SHIM_LIBRARY,
    SIM_DIR,
    SIM_DRIVER_NAME,
    shim_library,
    sim_driver_dir,
)

#: the library's path inside a container (the preload file names it there)
CONTAINER_LIBRARY = "/usr/lib/gpupool/libgpupool-cuda.so"
PRELOAD = "ld.so.preload"
#: an installed directory's name: <version>-<digest> (anything else under the root is not ours)
_INSTALLED = re.compile(r"[0-9A-Za-z.+_-]+-[0-9a-f]{12}")
_STAGING = ".install-"
#: a staging directory older than this was left by a plugin that died while installing
STAGING_STALE_S = 3600.0


def _sources(native_dir: Path) -> dict[str, Path]:
    """What a container may need, by its path under the installed directory."""
    sources = {SHIM_LIBRARY: shim_library(native_dir)}
    # a build without the simulated driver serves real GPUs only
    with contextlib.suppress(NativeLibraryError):
        sources[f"{SIM_DIR}/{SIM_DRIVER_NAME}"] = sim_driver_dir(native_dir) / SIM_DRIVER_NAME
    return sources


def _digest(sources: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].read_bytes())
    return digest.hexdigest()[:12]


def install(lib_root: Path, native_dir: Path = NATIVE_DIR) -> Path:
    """The installed directory of this version's files under `lib_root` (installed if new)."""
    sources = _sources(native_dir)
    target = lib_root / f"{__version__}-{_digest(sources)}"
    if target.is_dir():
        return target
    try:
        lib_root.mkdir(parents=True, exist_ok=True, mode=0o755)
        staging = Path(tempfile.mkdtemp(prefix=".install-", dir=lib_root))
        for name, source in sources.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, staging / name)
            os.chmod(staging / name, 0o555)
        (staging / PRELOAD).write_text(f"{CONTAINER_LIBRARY}\n")
        os.chmod(staging / PRELOAD, 0o444)
        for directory in (staging, *(p for p in staging.rglob("*") if p.is_dir())):
            os.chmod(directory, 0o755)
        try:
            staging.rename(target)
        except OSError:
            # another plugin installed the same files first: theirs stay, ours go
            shutil.rmtree(staging, ignore_errors=True)
            if not target.is_dir():
                raise
    except OSError as err:
        raise ConfigError(f"cannot install the container files under {lib_root}: {err}") from err
    return target


def mounted(names: Iterable[str], proc: Path = Path("/proc")) -> set[str]:
    """Those of `names` that some process on this host has mounted (a container's bind mount of
    an installed file: the name is a component of the mount's root in /proc/PID/mountinfo).
    The plugin runs with the host's PID namespace, so it sees every container's processes."""
    wanted = set(names)
    found: set[str] = set()
    for mountinfo in proc.glob("[0-9]*/mountinfo"):
        try:
            text = mountinfo.read_text()
        except OSError:
            continue  # the process ended, or is not ours to read
        for line in text.splitlines():
            fields = line.split(" ", 4)
            if len(fields) > 3:
                found |= wanted.intersection(fields[3].split("/"))
        if found == wanted:
            break
    return found


def prune(current: Path, allocated: Iterable[str], proc: Path = Path("/proc")) -> list[Path]:
    """Remove the installed directories beside `current` that no container uses any more: not
    `current`, not named in `allocated` (the directories the plugin handed to containers whose
    pods are still on the node, started or not) and mounted by no process; and staging
    directories of an install that died. Returns what was removed."""
    root = current.parent
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    keep = {current.name, *allocated}
    old = {p.name: p for p in entries if _INSTALLED.fullmatch(p.name) and p.name not in keep}
    stale = time.time() - STAGING_STALE_S
    removed = [old[name] for name in sorted(old.keys() - mounted(old, proc))]
    for entry in entries:
        if entry.name.startswith(_STAGING) and entry.lstat().st_mtime < stale:
            removed.append(entry)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
