"""Elastic memory through a share's region: suspend and resume requests, new limits, burst budgets.

The daemon writes (pwrite, never a mapping: a job can truncate its own region) the request word
and its sequence number, the memory and compute limits, and the burst's budget on each GPU; every
process of the share carries the request out (native/shim/elastic.c) and answers in its slot's
ack. Offsets follow native/include/gpupool_region.h (gpupool_region_elastic), as region.py does.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError
from gpupool.devices.procfs import process_start_time
from gpupool.isolation import region as reg

RUN = 0
SUSPEND = 1
ACK_RUNNING = 0
ACK_SUSPENDED = 1
ACK_WAITING = 2

_D = reg.DEVICES
_CONTROL = reg.ELASTIC_OFFSET  # u32 control, u32 pad, u64 control_seq
_HOST = _CONTROL + 16
_BURST_LIMIT = _HOST + 8 * _D
_BURST_USED = _BURST_LIMIT + 8 * _D
_BURST_DEVICE = _BURST_USED + 8 * _D
_BURST_ON_DEVICE = _BURST_DEVICE + 8 * _D
_ACK_SEQ = _BURST_ON_DEVICE + 8 * _D
_ACK_STATE = _ACK_SEQ + 8 * reg.PROCS
_COMPUTE_LIMIT = reg.LIMITS_OFFSET + 8 * _D
_U64S = struct.Struct(f"<{_D}Q")


@dataclass(frozen=True)
class ShareMemory:
    """A share's memory as its region holds it, per device ordinal of the share."""

    control: int
    seq: int
    memory_limit: tuple[int, ...]
    compute_limit: tuple[int, ...]
    used: tuple[int, ...]
    host_bytes: tuple[int, ...]
    burst_limit: tuple[int, ...]
    burst_used: tuple[int, ...]
    burst_on_device: tuple[int, ...]
    #: (ack_seq, ack_state) of each live process of the share
    acks: tuple[tuple[int, int], ...]

    def settled(self) -> bool:
        """Every live process has carried out the latest request."""
        return all(seq == self.seq and state != ACK_WAITING for seq, state in self.acks)

    def waiting_for_room(self) -> bool:
        """Asked to resume, a process found no room on its GPU yet."""
        return any(state == ACK_WAITING for _seq, state in self.acks)


def read(path: Path) -> ShareMemory | None:
    """The share's memory state; None when the region does not exist (yet) or is not initialised.
    ConfigError (one line) for a file that is not a region of this version."""
    try:
        fd = reg.open_region(path)
    except FileNotFoundError:
        return None
    try:
        data = os.pread(fd, reg.FILE_SIZE, 0)
    except OSError as err:
        raise ConfigError(f"cannot read the shared region {path}: {err.strerror}") from err
    finally:
        os.close(fd)
    if len(data) < reg.HEADER.size or not any(data[: reg.HEADER.size]):
        return None
    magic, version, size, _ = reg.HEADER.unpack_from(data)
    if magic != reg.MAGIC or version != reg.VERSION or size != reg.FILE_SIZE or len(data) < size:
        raise ConfigError(f"{path} is not a gpupool shared region of this version")
    control, _pad, seq = struct.unpack_from("<IIQ", data, _CONTROL)
    acks = []
    for slot in range(reg.PROCS):
        base = reg.PROCS_OFFSET + slot * reg.PROC_SIZE
        pid, _pad, start = struct.unpack_from("<iIQ", data, base)
        if pid <= 0 or process_start_time(pid) != start:
            continue
        (ack_seq,) = struct.unpack_from("<Q", data, _ACK_SEQ + 8 * slot)
        (ack_state,) = struct.unpack_from("<I", data, _ACK_STATE + 4 * slot)
        acks.append((ack_seq, ack_state))
    return ShareMemory(
        control=control,
        seq=seq,
        memory_limit=_U64S.unpack_from(data, reg.LIMITS_OFFSET),
        compute_limit=struct.unpack_from(f"<{_D}I", data, _COMPUTE_LIMIT),
        used=_U64S.unpack_from(data, reg.USED_OFFSET),
        host_bytes=_U64S.unpack_from(data, _HOST),
        burst_limit=_U64S.unpack_from(data, _BURST_LIMIT),
        burst_used=_U64S.unpack_from(data, _BURST_USED),
        burst_on_device=_U64S.unpack_from(data, _BURST_ON_DEVICE),
        acks=tuple(acks),
    )


def _write(path: Path, writes: list[tuple[int, bytes]]) -> None:
    try:
        fd = reg.open_region(path, write=True)
    except FileNotFoundError as err:
        raise ConfigError(f"the share's region {path} does not exist (yet)") from err
    try:
        if os.fstat(fd).st_size != reg.FILE_SIZE:
            raise ConfigError(f"{path} is not a gpupool shared region of this version")
        for offset, data in writes:
            os.pwrite(fd, data, offset)
    except OSError as err:
        raise ConfigError(f"cannot write the shared region {path}: {err.strerror}") from err
    finally:
        os.close(fd)


def request(path: Path, control: int, seq: int) -> None:
    """Ask the share to suspend (SUSPEND) or run (RUN); `seq` must be above the last one. The
    word is written before its number: a process that sees the new word with the old number acts
    on it and acknowledges the number at its next poll."""
    _write(path, [(_CONTROL, struct.pack("<I", control)), (_CONTROL + 8, struct.pack("<Q", seq))])


def set_memory_limit(path: Path, ordinals: range, limit: int) -> None:
    """The share's memory limit on each of `ordinals` (its device ordinals): read at the next
    allocation."""
    _write(path, [(reg.LIMITS_OFFSET + 8 * d, struct.pack("<Q", limit)) for d in ordinals])


def set_compute_limit(path: Path, ordinals: range, percent: int) -> None:
    """The share's compute percent on each of `ordinals`: read at the throttle's next batch."""
    _write(path, [(_COMPUTE_LIMIT + 4 * d, struct.pack("<I", percent)) for d in ordinals])


def set_burst_budget(path: Path, ordinals: range, budget: int) -> None:
    """How much of the share's burst may be on each GPU; the rest goes to host memory."""
    _write(path, [(_BURST_DEVICE + 8 * d, struct.pack("<Q", budget)) for d in ordinals])
