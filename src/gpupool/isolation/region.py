"""A share's accounting region, read: Python's side of native/include/gpupool_region.h.

Every process of a share maps one region file (GPUPOOL_SHARED_REGION; the daemon puts it in the
job's directory). Python reads the share's id (which names its slots in the GPUs' arbiters) and
its counters per device: allocations refused over the memory share, and the time its launches
were held back, sleeping for the compute cap or waiting for the GPU's lease. The library only
ever adds to the counters (relaxed atomics), so a read without its lock is a consistent snapshot
of each one. Offsets here and in the header change together (bump VERSION); a test compares them.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError

MAGIC = 0x314E474552505047  # b"GPPREGN1" as a little-endian u64
VERSION = 3
DEVICES = 16
PROCS = 256
SPANS = 16
HEADER = struct.Struct("<QIIQ")  # magic, version, size, share_id
COUNTERS = struct.Struct("<QQQ")  # refused, cap_wait_ns, lease_wait_ns
COUNTERS_OFFSET = 224
_COUNTERS_END = COUNTERS_OFFSET + DEVICES * COUNTERS.size
_LOCK_SIZE = 128
_PROC_SIZE = 16 + 8 * DEVICES
# counters, lock, used, credit_ns, credit_at_ns, spans, procs
FILE_SIZE = _COUNTERS_END + _LOCK_SIZE + 3 * 8 * DEVICES + DEVICES * SPANS * 16 + PROCS * _PROC_SIZE


@dataclass(frozen=True)
class DeviceCounters:
    """What held a share back on one device (its CUDA ordinal inside the share), since the
    region was created."""

    refused_allocations: int
    cap_wait_seconds: float
    lease_wait_seconds: float


def region_share_id(region: Path) -> int | None:
    """The id of the share whose accounting region is at `region`; None if it was never created
    (the command never used a GPU) or is not one of this version."""
    try:
        with region.open("rb") as f:
            head = f.read(HEADER.size)
    except OSError:
        return None
    if len(head) < HEADER.size:
        return None
    magic, version, _size, found = HEADER.unpack(head)
    return found if magic == MAGIC and version == VERSION else None


def read_counters(region: Path, devices: int = DEVICES) -> list[DeviceCounters] | None:
    """The share's counters on its first `devices` devices (index = the device's ordinal in the
    share); None if the region does not exist (yet). Raises ConfigError, one line, for a file
    that cannot be read or is not a region of this version."""
    devices = min(devices, DEVICES)
    try:
        fd = os.open(region, os.O_RDONLY | os.O_CLOEXEC)  # no file object: /metrics reads many
        try:
            data = os.pread(fd, _COUNTERS_END, 0)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ConfigError(f"cannot read the shared region {region}: {err.strerror}") from err
    if not any(data[: HEADER.size]):
        return None  # created (and maybe sized) by its first process, not yet initialised
    magic, version, size, _ = HEADER.unpack_from(data.ljust(HEADER.size, b"\0"))
    if magic != MAGIC or version != VERSION or size != FILE_SIZE or len(data) < _COUNTERS_END:
        raise ConfigError(
            f"{region} is not a gpupool shared region of this version (it reads version {VERSION})"
        )
    end = COUNTERS_OFFSET + devices * COUNTERS.size
    return [
        DeviceCounters(refused, cap_ns / 1e9, lease_ns / 1e9)
        for refused, cap_ns, lease_ns in COUNTERS.iter_unpack(data[COUNTERS_OFFSET:end])
    ]
