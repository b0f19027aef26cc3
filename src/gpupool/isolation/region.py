"""A share's accounting region, read: Python's side of native/include/gpupool_region.h.

Every process of a share maps one region file (GPUPOOL_SHARED_REGION; the daemon puts it in the
job's directory). Python reads its counters per device: allocations refused over the memory
share, and the time its launches were held back, sleeping for the compute cap or waiting for the
GPU's lease. The library only
ever adds to the counters (relaxed atomics), so a read without its lock is a consistent snapshot
of each one. Offsets here and in the header change together (bump VERSION); a test compares them.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError

MAGIC = 0x314E474552505047  # b"GPPREGN1" as a little-endian u64
VERSION = 4
DEVICES = 16
PROCS = 256
SPANS = 16
HEADER = struct.Struct("<QIIQ")  # magic, version, size, share_id
COUNTERS = struct.Struct("<QQQ")  # refused, cap_wait_ns, lease_wait_ns
COUNTERS_OFFSET = 224
_COUNTERS_END = COUNTERS_OFFSET + DEVICES * COUNTERS.size
_LOCK_SIZE = 128
_PROC_SIZE = 16 + 8 * DEVICES
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LIMITS_OFFSET = 32  # memory_limit[DEVICES] (u64), then compute_limit[DEVICES] (u32) at 160
USED_OFFSET = _COUNTERS_END + _LOCK_SIZE
PROCS_OFFSET = USED_OFFSET + 3 * 8 * DEVICES + DEVICES * SPANS * 16
PROC_SIZE = _PROC_SIZE
#: elastic memory's part (isolation/elastic.py reads and writes it), after the process table
ELASTIC_OFFSET = PROCS_OFFSET + PROCS * _PROC_SIZE
ELASTIC_SIZE = 16 + 5 * 8 * DEVICES + PROCS * 12
FILE_SIZE = ELASTIC_OFFSET + ELASTIC_SIZE


@dataclass(frozen=True)
class DeviceCounters:
    """What held a share back on one device (its CUDA ordinal inside the share), since the
    region was created."""

    refused_allocations: int
    cap_wait_seconds: float
    lease_wait_seconds: float


def open_region(region: Path, write: bool = False) -> int:
    """`region` opened for reading (or `write`: reading and writing, for the daemon's requests),
    as a file its share's user made: never through a link, never blocking (a FIFO), and only a
    regular file owned by the owner of its directory (the share's private directory); else
    ConfigError, one line. FileNotFoundError when missing."""
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        where = os.open(region.parent, _DIR_FLAGS)
        try:
            owner = os.fstat(where).st_uid
            fd = os.open(region.name, flags, dir_fd=where)
        finally:
            os.close(where)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ConfigError(f"cannot read the shared region {region}: {err.strerror}") from err
    found = os.fstat(fd)
    if stat.S_ISREG(found.st_mode) and found.st_uid == owner:
        return fd
    os.close(fd)
    what = "a regular file" if not stat.S_ISREG(found.st_mode) else f"owned by uid {owner}"
    raise ConfigError(f"the shared region {region} is not {what}: skipped")


def read_counters(region: Path, devices: int = DEVICES) -> list[DeviceCounters] | None:
    """The share's counters on its first `devices` devices (index = the device's ordinal in the
    share); None if the region does not exist (yet). Raises ConfigError, one line, for a file
    that cannot be read or is not a region of this version. One read: the file is closed after
    it (a reader of many regions, again and again, keeps them open with `OpenRegions`)."""
    regions = OpenRegions()
    try:
        return regions.read(region, devices)
    finally:
        regions.keep(())


class OpenRegions:
    """Regions kept open between reads, for /metrics, which reads every running share's counters
    at each scrape: one pread a region, not an open, a pread and a close (three system calls, the
    open a path lookup, and each lets the daemon's other threads take the GIL). A region's path
    is new at each launch (a fresh private directory) and the library creates the file once and
    never replaces it, so a descriptor kept by path reads that launch's region; `keep` closes
    those of the shares that ended. The file is the share's user's, opened as `open_region`
    says: a link, a FIFO or another user's file is refused, never waited on. No mapping: a job
    can truncate its region, and a read of a mapping past the end of its file kills the reader
    (SIGBUS), where pread just reads short. Thread-safe (two scrapes at once must not close a
    descriptor the other reads)."""

    def __init__(self) -> None:
        self._open: dict[Path, int] = {}
        self._lock = threading.Lock()

    def read(self, region: Path, devices: int = DEVICES) -> list[DeviceCounters] | None:
        """read_counters's answer for `region`, kept open after."""
        with self._lock:
            try:
                fd = self._open.get(region)
                if fd is None:
                    fd = self._open[region] = open_region(region)
                data = os.pread(fd, _COUNTERS_END, 0)
            except FileNotFoundError:
                return None
            except OSError as err:
                raise ConfigError(
                    f"cannot read the shared region {region}: {err.strerror}"
                ) from err
        return _counters(region, data, min(devices, DEVICES))

    def keep(self, regions: Iterable[Path]) -> None:
        """Close every region but `regions`."""
        kept = set(regions)
        with self._lock:
            for region in [r for r in self._open if r not in kept]:
                os.close(self._open.pop(region))


def _counters(region: Path, data: bytes, devices: int) -> list[DeviceCounters] | None:
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
