"""The shared state file of a simulated node: Python's side of native/include/gpupool_simstate.h.

Python creates the file and reads it; the simulated CUDA driver maps it and updates memory and
busy-time counters. Offsets here and in the header change together (bump VERSION).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import DeviceError
from gpupool.devices.procfs import process_start_time

MAGIC = 0x314D49534C505047  # b"GPPLSIM1" as a little-endian u64
VERSION = 3
MAX_GPUS = 16
MAX_PROCS = 256
HEADER_SIZE = 4096
GPU_RECORD_SIZE = 512
PROC_RECORD_SIZE = 64
GPUS_OFFSET = HEADER_SIZE
PROCS_OFFSET = GPUS_OFFSET + MAX_GPUS * GPU_RECORD_SIZE
#: MIG instance records (a GPU record's layout), one per (GPU, GPU instance id 1..7)
MIG_PER_GPU = 7
MAX_MIG = MAX_GPUS * MIG_PER_GPU
MIG_OFFSET = PROCS_OFFSET + MAX_PROCS * PROC_RECORD_SIZE
STATE_SIZE = MIG_OFFSET + MAX_MIG * GPU_RECORD_SIZE
STATE_FILE = "state.bin"

#: a launch of 256 blocks x 128 threads takes about 1 ms
DEFAULT_KERNEL_PS_PER_THREAD = 30518

FLAG_LOST = 0x1
FLAG_NOT_SUPPORTED = 0x2

#: a process slot's kind (zero, compute, is what the simulated driver's slots hold)
PROC_COMPUTE = 0
PROC_GRAPHICS = 1
PROC_BOTH = 2

_HEADER = struct.Struct("<QIIIIIIQ")  # magic .. kernel_ps_per_thread
_GPU_STRINGS = struct.Struct("<48s96s32s")  # uuid, name, model at offset 0
_GPU_COUNTERS = struct.Struct("<QQQQIIII32s")  # memory_total .. pci_bus_id at offset 176
#: elastic memory: the GPU's host link bandwidth (bytes/s) in its record
HOST_LINK_AT = 264
_PROC = struct.Struct("<iiQQQQ")  # pid, gpu, start_time, memory_used, busy_ns, last_launch_ns
#: a slot's kind (u32); the driver's own MPS fields, which Python leaves alone, lie before it
_PROC_KIND_AT = 56


@dataclass(frozen=True)
class SimGpuSpec:
    """What the file records of one simulated GPU at creation."""

    uuid: str
    name: str
    model: str
    memory_total: int
    sm_count: int
    cc_major: int
    cc_minor: int
    pci_bus_id: str
    #: host<->device copy bandwidth (elastic memory); 0: copies take no simulated time
    host_link_bytes_s: int = 0


@dataclass(frozen=True)
class SimGpuCounters:
    """One GPU as the file holds it now."""

    index: int
    uuid: str
    name: str
    model: str
    memory_total: int
    memory_used: int
    busy_ns_total: int
    busy_until_ns: int
    sm_count: int
    cc_major: int
    cc_minor: int
    flags: int
    pci_bus_id: str

    @property
    def lost(self) -> bool:
        return bool(self.flags & FLAG_LOST)


@dataclass(frozen=True)
class SimProcSlot:
    """One (process, GPU) slot; `slot` is its index in the table."""

    slot: int
    pid: int
    gpu: int
    start_time: int
    memory_used: int
    busy_ns: int
    last_launch_ns: int
    kind: int = PROC_COMPUTE


@dataclass(frozen=True)
class SimInstanceSpec:
    """What the file records of one MIG instance: the simulated driver shows it as a device."""

    gi_id: int
    uuid: str
    name: str
    memory_total: int
    sm_count: int


def mig_device_number(gpu: int, gi_id: int) -> int:
    """The number a process slot gives a MIG instance's device (gpupool_simstate.h)."""
    if not 1 <= gi_id <= MIG_PER_GPU:
        raise DeviceError(f"GPU instance id {gi_id} is outside 1..{MIG_PER_GPU}")
    return MAX_GPUS + gpu * MIG_PER_GPU + gi_id - 1


def parent_gpu(device: int) -> int:
    """The GPU index of a process slot's device number (a GPU's own, or its instance's)."""
    return device if device < MAX_GPUS else (device - MAX_GPUS) // MIG_PER_GPU


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _encode(text: str, size: int, what: str) -> bytes:
    data = text.encode()
    if len(data) >= size:
        raise DeviceError(f"simulated GPU {what} {text!r} is longer than {size - 1} bytes")
    return data


def is_slot_alive(slot: SimProcSlot) -> bool:
    """The slot's process still runs and is the same process (not a reused pid)."""
    return slot.pid > 0 and process_start_time(slot.pid) == slot.start_time


class SimState:
    """A mapped state file. Reads are lock-free snapshots of counters the driver updates."""

    def __init__(self, path: Path, mapping: mmap.mmap) -> None:
        self.path = path
        self._map = mapping

    @classmethod
    def create(
        cls,
        path: Path,
        gpus: Sequence[SimGpuSpec],
        kernel_ps_per_thread: int = DEFAULT_KERNEL_PS_PER_THREAD,
    ) -> SimState:
        """Write a fresh state file for `gpus` (replacing any), then map it."""
        if not 0 < len(gpus) <= MAX_GPUS:
            raise DeviceError(f"a simulated node holds 1 to {MAX_GPUS} GPUs, not {len(gpus)}")
        buf = bytearray(STATE_SIZE)
        _HEADER.pack_into(
            buf,
            0,
            MAGIC,
            VERSION,
            len(gpus),
            MAX_PROCS,
            HEADER_SIZE,
            GPU_RECORD_SIZE,
            PROC_RECORD_SIZE,
            kernel_ps_per_thread,
        )
        for index, gpu in enumerate(gpus):
            base = GPUS_OFFSET + index * GPU_RECORD_SIZE
            _GPU_STRINGS.pack_into(
                buf,
                base,
                _encode(gpu.uuid, 48, "uuid"),
                _encode(gpu.name, 96, "name"),
                _encode(gpu.model, 32, "model"),
            )
            _GPU_COUNTERS.pack_into(
                buf,
                base + 176,
                gpu.memory_total,
                0,
                0,
                0,
                gpu.sm_count,
                gpu.cc_major,
                gpu.cc_minor,
                0,
                _encode(gpu.pci_bus_id, 32, "PCI bus id"),
            )
            struct.pack_into("<Q", buf, base + HOST_LINK_AT, gpu.host_link_bytes_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(bytes(buf))
        # every user's processes on the simulated driver write it, as every user opens a real
        # node's /dev/nvidia* devices (0666)
        tmp.chmod(0o666)
        os.replace(tmp, path)  # readers never see a half-written file
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> SimState:
        """Map an existing state file, checking magic, version and size."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as err:
            raise DeviceError(f"cannot open simulated node state {path}: {err.strerror}") from err
        try:
            if os.fstat(fd).st_size != STATE_SIZE:
                raise DeviceError(f"{path} is not a gpupool simulated node state (wrong size)")
            mapping = mmap.mmap(fd, STATE_SIZE)
        finally:
            os.close(fd)
        magic, version = struct.unpack_from("<QI", mapping, 0)
        if magic != MAGIC:
            mapping.close()
            raise DeviceError(f"{path} is not a gpupool simulated node state (bad magic)")
        if version != VERSION:
            mapping.close()
            raise DeviceError(f"{path} has state version {version}; this gpupool reads {VERSION}")
        return cls(path, mapping)

    @staticmethod
    def is_outdated(path: Path) -> bool:
        """The file is a node state of an older layout (an earlier gpupool made it)."""
        try:
            with path.open("rb") as file:
                head = file.read(12)
        except OSError:
            return False
        if len(head) < 12:
            return False
        magic, version = struct.unpack("<QI", head)
        return bool(magic == MAGIC and version < VERSION)

    def close(self) -> None:
        self._map.close()

    @property
    def gpu_count(self) -> int:
        return int(struct.unpack_from("<I", self._map, 12)[0])

    @property
    def kernel_ps_per_thread(self) -> int:
        return int(struct.unpack_from("<Q", self._map, 32)[0])

    def gpu(self, index: int) -> SimGpuCounters:
        if not 0 <= index < self.gpu_count:
            raise DeviceError(f"simulated GPU {index} does not exist (0..{self.gpu_count - 1})")
        base = GPUS_OFFSET + index * GPU_RECORD_SIZE
        uuid, name, model = _GPU_STRINGS.unpack_from(self._map, base)
        (total, used, busy, until, sms, major, minor, flags, bus) = _GPU_COUNTERS.unpack_from(
            self._map, base + 176
        )
        return SimGpuCounters(
            index,
            _cstr(uuid),
            _cstr(name),
            _cstr(model),
            total,
            used,
            busy,
            until,
            sms,
            major,
            minor,
            flags,
            _cstr(bus),
        )

    def gpus(self) -> list[SimGpuCounters]:
        return [self.gpu(i) for i in range(self.gpu_count)]

    def procs(self, *, live_only: bool = True) -> Iterator[SimProcSlot]:
        """Occupied process slots; by default only those whose process still runs."""
        for slot in range(MAX_PROCS):
            base = PROCS_OFFSET + slot * PROC_RECORD_SIZE
            (kind,) = struct.unpack_from("<I", self._map, base + _PROC_KIND_AT)
            pid, gpu, start_time, memory_used, busy_ns, last_launch_ns = _PROC.unpack_from(
                self._map, base
            )
            record = SimProcSlot(
                slot, pid, gpu, start_time, memory_used, busy_ns, last_launch_ns, kind
            )
            if record.pid == 0 or (live_only and not is_slot_alive(record)):
                continue
            yield record

    def set_flags(self, index: int, flags: int) -> None:
        """Stage a scenario on GPU `index` (FLAG_LOST, FLAG_NOT_SUPPORTED)."""
        self.gpu(index)  # range check
        struct.pack_into("<I", self._map, GPUS_OFFSET + index * GPU_RECORD_SIZE + 220, flags)

    def write_proc(self, slot: int, proc: SimProcSlot) -> None:
        """Write a process slot directly: for tests and scenario fixtures, as the driver would."""
        if not 0 <= slot < MAX_PROCS:
            raise DeviceError(f"process slot {slot} out of range")
        _PROC.pack_into(
            self._map,
            PROCS_OFFSET + slot * PROC_RECORD_SIZE,
            proc.pid,
            proc.gpu,
            proc.start_time,
            proc.memory_used,
            proc.busy_ns,
            proc.last_launch_ns,
        )
        struct.pack_into(
            "<I", self._map, PROCS_OFFSET + slot * PROC_RECORD_SIZE + _PROC_KIND_AT, proc.kind
        )

    def set_gpu_usage(self, index: int, memory_used: int, busy_ns_total: int) -> None:
        """Write a GPU's memory and busy counters directly: for tests, as the driver would."""
        self.gpu(index)
        struct.pack_into(
            "<QQ",
            self._map,
            GPUS_OFFSET + index * GPU_RECORD_SIZE + 184,
            memory_used,
            busy_ns_total,
        )

    def set_instances(self, index: int, instances: Sequence[SimInstanceSpec]) -> None:
        """Make GPU `index`'s MIG instance records match `instances` (node.json's layout): a
        record whose uuid stays keeps its counters, a new one starts from zero, the rest are
        freed, so the driver stops offering a destroyed instance."""
        gpu = self.gpu(index)
        wanted = {i.gi_id: i for i in instances}
        for gi_id in range(1, MIG_PER_GPU + 1):
            base = MIG_OFFSET + (mig_device_number(index, gi_id) - MAX_GPUS) * GPU_RECORD_SIZE
            spec = wanted.get(gi_id)
            if spec is None:
                self._map[base : base + GPU_RECORD_SIZE] = bytes(GPU_RECORD_SIZE)
                continue
            if _cstr(self._map[base : base + 48]) == spec.uuid:
                continue
            record = bytearray(GPU_RECORD_SIZE)
            _GPU_STRINGS.pack_into(
                record,
                0,
                _encode(spec.uuid, 48, "uuid"),
                _encode(spec.name, 96, "name"),
                _encode(gpu.model, 32, "model"),
            )
            _GPU_COUNTERS.pack_into(
                record,
                176,
                spec.memory_total,
                0,
                0,
                0,
                spec.sm_count,
                gpu.cc_major,
                gpu.cc_minor,
                0,
                _encode(gpu.pci_bus_id, 32, "PCI bus id"),
            )
            struct.pack_into("<I", record, 256, index + 1)
            self._map[base : base + GPU_RECORD_SIZE] = bytes(record)
