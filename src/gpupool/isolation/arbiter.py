"""The GPUs' compute arbiters, read: Python's side of native/include/gpupool_arbiter.h.

Every compute share on a GPU has a slot in the GPU's arbiter file (in the node's arbiter
directory), where the interception library keeps its percent, priority, policy, the latest of its
processes and the GPU time measured for it. `gpupool gpus` shows each live share's use against its
share; `gpupool exec` says what its own share used. Offsets here and in the header change together
(bump VERSION); a test compares them.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError

MAGIC = 0x3142524150505047  # b"GPPARB1" as a little-endian u64
VERSION = 3
SHARES = 64
HEADER = struct.Struct("<QII")  # magic, version, size
SHARES_OFFSET = 192
SHARE = struct.Struct("<QIIQQQiI")  # share_id .. policy
FILE_SIZE = SHARES_OFFSET + SHARES * SHARE.size
FILE_PREFIX = "gpupool-arbiter-"

#: the library's numbers for a share's priority and policy
PRIORITIES = {0: None, 1: "high", 2: "low"}
POLICIES = {0: "cap", 1: "share"}

#: a share whose processes last asked for a GPU this long ago is not shown as running
LIVE_SECONDS = 10.0


@dataclass(frozen=True)
class ArbitratedShare:
    """One share's slot in a GPU's arbiter, as read at `read_ns` (CLOCK_MONOTONIC)."""

    share_id: int
    percent: int
    priority: str | None
    policy: str
    pid: int
    busy_ns: int
    wanted_ns: int
    read_ns: int


@dataclass(frozen=True)
class ComputeUse:
    """A share's measured GPU use over a window, against its share."""

    share: ArbitratedShare
    used_percent: float


def arbiter_dir(sim_node: Path | None) -> Path:
    """The node-wide directory of the GPUs' compute arbiters (one file per GPU UUID), the same
    for `gpupool exec` and the node daemon: a simulated node's own directory, else /dev/shm.
    (The Kubernetes device plugin keeps its pods' arbiters in a directory of its own, which it
    mounts into every container: the host's /dev/shm is not for a pod to see.)"""
    return sim_node if sim_node is not None else Path("/dev/shm")


def arbiter_file(directory: Path, gpu_uuid: str) -> Path:
    """The arbiter of the GPU `gpu_uuid` ("GPU-xxxxxxxx-..."): its 32 hex digits, as the library
    names it from cuDeviceGetUuid."""
    digits = gpu_uuid.removeprefix("GPU-").replace("-", "").lower()
    return directory / f"{FILE_PREFIX}{digits}"


def prepare_arbiters(directory: Path, gpu_uuids: Sequence[str]) -> None:
    """Create each GPU's arbiter file, empty, as this process's (the daemon's) with mode 0666,
    where none exists: the first share of any user then initialises it in place. Made by a
    share itself, the file would be that share's user's, and on a host with
    fs.protected_regular=1 no other user could open it in a sticky directory such as
    /dev/shm (the kernel refuses O_CREAT on another user's file there), so a second user's
    share would die at start. (The file stays writable by every share: see the threat model.)"""
    for uuid in gpu_uuids:
        path = arbiter_file(directory, uuid)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except FileExistsError:
            continue
        except OSError as err:
            raise ConfigError(f"cannot create the compute arbiter {path}: {err.strerror}") from err
        try:
            os.fchmod(fd, 0o666)  # past the umask
        finally:
            os.close(fd)


def read_shares(path: Path) -> list[ArbitratedShare]:
    """Every share with a slot in the arbiter at `path`; none if the GPU has no arbiter yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ConfigError(f"cannot read the compute arbiter {path}: {err.strerror}") from err
    now = time.monotonic_ns()
    if not any(data[: HEADER.size]):
        return []  # created (and maybe sized) by its first process, not yet initialised
    magic, version, size = HEADER.unpack_from(data.ljust(HEADER.size, b"\0"))
    if magic != MAGIC or version != VERSION or size != FILE_SIZE or len(data) != FILE_SIZE:
        raise ConfigError(
            f"{path} is not a compute arbiter of this gpupool version (it reads version "
            f"{VERSION}): remove it when no workload runs on this GPU"
        )
    shares = []
    for slot in range(SHARES):
        share_id, weight, priority, _vtime, wanted, busy, pid, policy = SHARE.unpack_from(
            data, SHARES_OFFSET + slot * SHARE.size
        )
        if share_id != 0:
            shares.append(
                ArbitratedShare(
                    share_id,
                    weight,
                    PRIORITIES.get(priority),
                    POLICIES.get(policy, "cap"),
                    pid,
                    busy,
                    wanted,
                    now,
                )
            )
    return shares


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return pid > 0


def live_shares(path: Path) -> list[ArbitratedShare]:
    """The shares whose processes still run and asked for the GPU recently."""
    cutoff = time.monotonic_ns() - int(LIVE_SECONDS * 1e9)
    return [s for s in read_shares(path) if s.wanted_ns >= cutoff and _alive(s.pid)]


def compute_use(paths: Sequence[Path], window_s: float) -> list[list[ComputeUse]]:
    """For the arbiter of each GPU in `paths`: each live share's GPU use over the next
    `window_s` seconds, in percent of the GPU (one wait for all; none if no share is live)."""
    before = [{s.share_id: s for s in live_shares(path)} for path in paths]
    if not any(before):
        return [[] for _ in paths]
    time.sleep(window_s)
    result = []
    for path, earlier in zip(paths, before, strict=True):
        uses = []
        for share in live_shares(path) if earlier else []:
            first = earlier.get(share.share_id)
            if first is None:
                continue
            elapsed = share.read_ns - first.read_ns
            used = 100.0 * (share.busy_ns - first.busy_ns) / elapsed if elapsed > 0 else 0.0
            uses.append(ComputeUse(share, used))
        result.append(uses)
    return result


def find_share(directory: Path, gpu_uuid: str, share_id: int) -> ArbitratedShare | None:
    """The slot of share `share_id` in the arbiter of `gpu_uuid`, if it has one."""
    for share in read_shares(arbiter_file(directory, gpu_uuid)):
        if share.share_id == share_id:
            return share
    return None
