"""The GPUs' compute arbiter, read: Python's side of native/include/gpupool_arbiter.h.

The trusted arbiter (native/arbiterd, one per node) keeps one view per GPU in its runtime
directory, a file it alone writes: each registered share's percent, priority and policy, the
lease time charged to it, and the processes that ask for leases. `gpupool gpus` shows each live
share's use against its share, `gpupool exec` what its own share used, and the watchdog tells a
process that uses a GPU without asking for its lease. Offsets here and in the header change
together (bump VERSION); a test compares them.
"""

from __future__ import annotations

import os
import stat
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError

MAGIC = 0x3242524150505047  # b"GPPARB2" as a little-endian u64
VERSION = 6
SHARES = 64
CLIENTS = 256
HEADER = struct.Struct("<QII")  # magic, version, size
SHARES_OFFSET = 128
SHARE = struct.Struct("<QIIQQQiIIIIIII")  # share_id .. clients, slice_us, reserved
CLIENTS_OFFSET = SHARES_OFFSET + SHARES * SHARE.size
CLIENT = struct.Struct("<iIQ")  # pid, slot, start
FILE_SIZE = CLIENTS_OFFSET + CLIENTS * CLIENT.size
VIEW_PREFIX = "gpu-"
SOCKET = "lease.sock"
CONTROL = "control.sock"

#: the library's numbers for a share's priority and policy
PRIORITIES = {0: None, 1: "high", 2: "low"}
POLICIES = {0: "cap", 1: "share"}

#: a share whose processes last asked for a GPU this long ago is not shown as running
LIVE_SECONDS = 10.0


@dataclass(frozen=True)
class ArbitratedShare:
    """One share's slot in a GPU's view, as read at `read_ns` (CLOCK_MONOTONIC)."""

    share_id: int
    percent: int
    priority: str | None
    policy: str
    pid: int
    busy_ns: int
    wanted_ns: int
    read_ns: int
    clients: int = 0
    #: its lease length next to busy shares of its class, in microseconds (0: the batch window)
    slice_us: int = 0


@dataclass(frozen=True)
class LeaseClient:
    """A process connected to the arbiter for a share on one GPU."""

    pid: int
    start: int
    share_id: int


@dataclass(frozen=True)
class ComputeUse:
    """A share's charged GPU use over a window, against its share."""

    share: ArbitratedShare
    used_percent: float


def view_file(directory: Path, gpu_uuid: str) -> Path:
    """The view of the GPU `gpu_uuid` ("GPU-xxxxxxxx-..." or "MIG-..."): its 32 hex digits, as
    the library names it from cuDeviceGetUuid."""
    return directory / f"{VIEW_PREFIX}{uuid_bytes(gpu_uuid).hex()}"


def uuid_bytes(gpu_uuid: str) -> bytes:
    """The 16 bytes cuDeviceGetUuid gives for `gpu_uuid`; ConfigError if it is no UUID."""
    digits = gpu_uuid.removeprefix("GPU-").removeprefix("MIG-").replace("-", "").lower()
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise ConfigError(f"{gpu_uuid!r} is not a GPU UUID")
    return raw


def _read(path: Path) -> bytes | None:
    """The view's bytes, only from a regular file of the directory's owner (the arbiter's
    user); None if the GPU has no view yet."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        owner = os.stat(path.parent).st_uid
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ConfigError(f"cannot read the compute arbiter's view {path}: {err.strerror}") from err
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != owner:
            raise ConfigError(f"{path} is not the compute arbiter's view: ignored")
        return os.read(fd, FILE_SIZE + 1)
    finally:
        os.close(fd)


def _view(path: Path) -> bytes | None:
    data = _read(path)
    if data is None:
        return None
    magic, version, size = HEADER.unpack_from(data.ljust(HEADER.size, b"\0"))
    if magic != MAGIC or version != VERSION or size != FILE_SIZE or len(data) != FILE_SIZE:
        raise ConfigError(
            f"{path} is not a compute arbiter's view of this gpupool version (it reads version "
            f"{VERSION}): restart the arbiter (the node daemon does)"
        )
    return data


def read_shares(path: Path) -> list[ArbitratedShare]:
    """Every share registered in the view at `path`; none if the GPU has no view yet."""
    data = _view(path)
    if data is None:
        return []
    now = time.monotonic_ns()
    shares = []
    for slot in range(SHARES):
        fields = SHARE.unpack_from(data, SHARES_OFFSET + slot * SHARE.size)
        share_id, weight, priority, _vtime, wanted, busy, pid, policy = fields[:8]
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
                    fields[11],
                    fields[12],
                )
            )
    return shares


def lease_clients(path: Path) -> list[LeaseClient]:
    """The processes connected to the arbiter for a share on the view's GPU."""
    data = _view(path)
    if data is None:
        return []
    ids = {
        slot: SHARE.unpack_from(data, SHARES_OFFSET + slot * SHARE.size)[0]
        for slot in range(SHARES)
    }
    clients = []
    for entry in range(CLIENTS):
        pid, slot, start = CLIENT.unpack_from(data, CLIENTS_OFFSET + entry * CLIENT.size)
        if pid > 0:
            clients.append(LeaseClient(pid, start, ids.get(slot, 0)))
    return clients


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
    """For the view of each GPU in `paths`: each live share's charged GPU use over the next
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
    """The slot of share `share_id` in the view of `gpu_uuid`, if it has one."""
    for share in read_shares(view_file(directory, gpu_uuid)):
        if share.share_id == share_id:
            return share
    return None
