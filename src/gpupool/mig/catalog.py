"""The MIG profile catalog: GPU models, their MIG profiles, sizes and valid placements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MiB

# NVML's GPU instance profile constants (nvml.h NVML_GPU_INSTANCE_PROFILE_*): the argument of
# nvmlDeviceGetGpuInstanceProfileInfo. They name a slice shape, not a model's profile: the same
# constant is 1g.5gb on an A100-40GB and 1g.18gb on an H200.
NVML_PROFILE_1_SLICE = 0
NVML_PROFILE_2_SLICE = 1
NVML_PROFILE_3_SLICE = 2
NVML_PROFILE_4_SLICE = 3
NVML_PROFILE_7_SLICE = 4
NVML_PROFILE_8_SLICE = 5
NVML_PROFILE_6_SLICE = 6
NVML_PROFILE_1_SLICE_REV1 = 7  # 1 slice with media extensions (+me)
NVML_PROFILE_2_SLICE_REV1 = 8  # 2 slices with media extensions (+me)
NVML_PROFILE_1_SLICE_REV2 = 9  # 1 compute slice, 2 memory slices (1g.10gb on A100-40GB)


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of one GPU model.

    Placements are in memory slices: an instance at `start` occupies slices
    `start .. start + memory_slices - 1`, as nvmlDeviceGetGpuInstancePossiblePlacements reports.
    """

    name: str
    nvml_profile: int
    #: the profile id nvidia-smi prints (nvmlGpuInstanceProfileInfo_t.id), e.g. 19 for 1g.10gb
    smi_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    sm_count: int
    max_instances: int
    starts: tuple[int, ...]

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @property
    def size(self) -> int:
        """Memory slices occupied: the placement size."""
        return self.memory_slices

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")

    def slots(self, start: int) -> range:
        """The memory slices an instance at `start` occupies."""
        return range(start, start + self.memory_slices)


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model and its profile table."""

    name: str
    aliases: tuple[str, ...]
    #: the name NVML reports (nvmlDeviceGetName) for the reference board
    marketing_name: str
    #: other names NVML reports for boards of the same memory size (PCIe, NVL, ...)
    other_names: tuple[str, ...]
    #: PCI device ids as mig-parted's device-filter writes them (device << 16 | vendor 0x10DE)
    pci_device_ids: tuple[str, ...]
    memory_mib: int
    sm_count: int
    compute_capability: tuple[int, int]
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    #: True when every profile's memory and SM count is the driver's own figure; False when
    #: some are nominal (the profile name's size) and wait for a check on real hardware
    exact: bool = True

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @property
    def pci_device_id(self) -> str:
        """The reference board's PCI device id (first of `pci_device_ids`)."""
        return self.pci_device_ids[0]

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    def profile(self, name: str) -> MigProfile:
        """The profile called `name` (case-insensitive, an optional `MIG ` prefix allowed)."""
        wanted = name.strip().lower().removeprefix("mig ").removeprefix("mig-").strip()
        for profile in self.profiles:
            if profile.name == wanted:
                return profile
        raise InvalidRequest(
            f"unknown MIG profile {name!r} for {self.name}; known: {', '.join(self.profile_names)}"
        )

    def has_profile(self, name: str) -> bool:
        try:
            self.profile(name)
        except InvalidRequest:
            return False
        return True


# The 7-compute-slice, 8-memory-slice family (A100, H100, H200, B200): one row per profile
# shape; the model supplies the name, memory and SM count of each.
#   key: (nvml constant, smi id, compute slices, memory slices, max instances, starts)
_SEVEN_SLICE_SHAPES: dict[str, tuple[int, int, int, int, int, tuple[int, ...]]] = {
    "1g": (NVML_PROFILE_1_SLICE, 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": (NVML_PROFILE_1_SLICE_REV1, 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.2x": (NVML_PROFILE_1_SLICE_REV2, 15, 1, 2, 4, (0, 2, 4, 6)),
    "2g": (NVML_PROFILE_2_SLICE, 14, 2, 2, 3, (0, 2, 4)),
    "3g": (NVML_PROFILE_3_SLICE, 9, 3, 4, 2, (0, 4)),
    "4g": (NVML_PROFILE_4_SLICE, 5, 4, 4, 1, (0,)),
    "7g": (NVML_PROFILE_7_SLICE, 0, 7, 8, 1, (0,)),
}

# A30: 4 compute and 4 memory slices, and its own smi ids.
_A30_SHAPES: dict[str, tuple[int, int, int, int, int, tuple[int, ...]]] = {
    "1g": (NVML_PROFILE_1_SLICE, 14, 1, 1, 4, (0, 1, 2, 3)),
    "1g+me": (NVML_PROFILE_1_SLICE_REV1, 21, 1, 1, 1, (0, 1, 2, 3)),
    "2g": (NVML_PROFILE_2_SLICE, 5, 2, 2, 2, (0, 2)),
    "2g+me": (NVML_PROFILE_2_SLICE_REV1, 6, 2, 2, 1, (0, 2)),
    "4g": (NVML_PROFILE_4_SLICE, 0, 4, 4, 1, (0,)),
}


def _nominal_mib(gigabytes: int) -> int:
    """A profile's memory when only its name is known: the name's GB (10^9 bytes) in MiB."""
    return gigabytes * 1000**3 // MiB


def _profiles(
    shapes: dict[str, tuple[int, int, int, int, int, tuple[int, ...]]],
    rows: Iterable[tuple[str, str, int, int]],
) -> tuple[MigProfile, ...]:
    """Build profiles from (shape key, profile name, memory MiB, SM count) rows."""
    built = []
    for shape, name, memory_mib, sms in rows:
        nvml_profile, smi_id, compute, memory, max_instances, starts = shapes[shape]
        built.append(
            MigProfile(
                name=name,
                nvml_profile=nvml_profile,
                smi_id=smi_id,
                compute_slices=compute,
                memory_slices=memory,
                memory_mib=memory_mib,
                sm_count=sms,
                max_instances=max_instances,
                starts=starts,
            )
        )
    return tuple(built)


# Memory sizes are the MiB the driver reports per profile (nvidia-smi mig -lgip prints them
# in GiB with two decimals: 9.75 GiB = 9984 MiB). H200 and B200 are nominal, the name's GB
# (see `exact`), until a driver's table confirms them.
MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        name="A30-24GB",
        aliases=("A30",),
        marketing_name="NVIDIA A30",
        other_names=(),
        pci_device_ids=("0x20B710DE",),
        memory_mib=24576,
        sm_count=56,
        compute_capability=(8, 0),
        memory_slices=4,
        compute_slices=4,
        profiles=_profiles(
            _A30_SHAPES,
            [
                ("1g", "1g.6gb", 5952, 14),
                ("1g+me", "1g.6gb+me", 5952, 14),
                ("2g", "2g.12gb", 11968, 28),
                ("2g+me", "2g.12gb+me", 11968, 28),
                ("4g", "4g.24gb", 24000, 56),
            ],
        ),
    ),
    GpuModel(
        name="A100-40GB",
        aliases=("A100-40", "A100-SXM4-40GB"),
        marketing_name="NVIDIA A100-SXM4-40GB",
        other_names=("NVIDIA A100-PCIE-40GB",),
        pci_device_ids=("0x20B010DE", "0x20B110DE", "0x20F110DE"),
        memory_mib=40960,
        sm_count=108,
        compute_capability=(8, 0),
        memory_slices=8,
        compute_slices=7,
        profiles=_profiles(
            _SEVEN_SLICE_SHAPES,
            [
                ("1g", "1g.5gb", 4864, 14),
                ("1g+me", "1g.5gb+me", 4864, 14),
                ("1g.2x", "1g.10gb", 9856, 14),
                ("2g", "2g.10gb", 9856, 28),
                ("3g", "3g.20gb", 19968, 42),
                ("4g", "4g.20gb", 19968, 56),
                ("7g", "7g.40gb", 40192, 98),
            ],
        ),
    ),
    GpuModel(
        name="A100-80GB",
        aliases=("A100-80", "A100-SXM4-80GB"),
        marketing_name="NVIDIA A100-SXM4-80GB",
        other_names=("NVIDIA A100 80GB PCIe",),
        pci_device_ids=("0x20B210DE", "0x20B510DE"),
        memory_mib=81920,
        sm_count=108,
        compute_capability=(8, 0),
        memory_slices=8,
        compute_slices=7,
        profiles=_profiles(
            _SEVEN_SLICE_SHAPES,
            [
                ("1g", "1g.10gb", 9728, 14),
                ("1g+me", "1g.10gb+me", 9728, 14),
                ("1g.2x", "1g.20gb", 19968, 14),
                ("2g", "2g.20gb", 19968, 28),
                ("3g", "3g.40gb", 40192, 42),
                ("4g", "4g.40gb", 40192, 56),
                ("7g", "7g.80gb", 80896, 98),
            ],
        ),
    ),
    GpuModel(
        name="H100-80GB",
        aliases=("H100", "H100-SXM5-80GB"),
        marketing_name="NVIDIA H100 80GB HBM3",
        other_names=("NVIDIA H100 PCIe",),
        pci_device_ids=("0x233010DE", "0x233110DE"),
        memory_mib=81559,
        sm_count=132,
        compute_capability=(9, 0),
        memory_slices=8,
        compute_slices=7,
        profiles=_profiles(
            _SEVEN_SLICE_SHAPES,
            [
                ("1g", "1g.10gb", 9984, 16),
                ("1g+me", "1g.10gb+me", 9984, 16),
                ("1g.2x", "1g.20gb", 20096, 26),
                ("2g", "2g.20gb", 20096, 32),
                ("3g", "3g.40gb", 40448, 60),
                ("4g", "4g.40gb", 40448, 64),
                ("7g", "7g.80gb", 81152, 132),
            ],
        ),
    ),
    GpuModel(
        name="H100-94GB",
        aliases=("H100-NVL", "H100-94"),
        marketing_name="NVIDIA H100 NVL",
        other_names=(),
        pci_device_ids=("0x232110DE",),
        memory_mib=95830,
        sm_count=132,
        compute_capability=(9, 0),
        memory_slices=8,
        compute_slices=7,
        profiles=_profiles(
            _SEVEN_SLICE_SHAPES,
            [
                ("1g", "1g.12gb", 10880, 16),
                ("1g+me", "1g.12gb+me", 10880, 16),
                ("1g.2x", "1g.24gb", 22016, 26),
                ("2g", "2g.24gb", 22016, 32),
                ("3g", "3g.47gb", 47232, 60),
                ("4g", "4g.47gb", 47232, 64),
                ("7g", "7g.94gb", 94848, 132),
            ],
        ),
    ),
    # H200: the same 132-SM GH100 as the H100-80GB, so the same SMs per profile; memory nominal.
    GpuModel(
        name="H200-141GB",
        aliases=("H200",),
        marketing_name="NVIDIA H200",
        other_names=("NVIDIA H200 NVL",),
        pci_device_ids=("0x233510DE", "0x233B10DE"),
        memory_mib=143771,
        sm_count=132,
        compute_capability=(9, 0),
        memory_slices=8,
        compute_slices=7,
        profiles=_profiles(
            _SEVEN_SLICE_SHAPES,
            [
                ("1g", "1g.18gb", _nominal_mib(18), 16),
                ("1g+me", "1g.18gb+me", _nominal_mib(18), 16),
                ("1g.2x", "1g.35gb", _nominal_mib(35), 26),
                ("2g", "2g.35gb", _nominal_mib(35), 32),
                ("3g", "3g.71gb", _nominal_mib(71), 60),
                ("4g", "4g.71gb", _nominal_mib(71), 64),
                ("7g", "7g.141gb", _nominal_mib(141), 132),
            ],
        ),
        exact=False,
    ),
    # B200: 18 SMs per compute slice (1g); the larger profiles' SMs and all memory are nominal.
    GpuModel(
        name="B200-180GB",
        aliases=("B200",),
        marketing_name="NVIDIA B200",
        other_names=(),
        pci_device_ids=("0x290110DE",),
        memory_mib=183359,
        sm_count=148,
        compute_capability=(10, 0),
        memory_slices=8,
        compute_slices=7,
        profiles=_profiles(
            _SEVEN_SLICE_SHAPES,
            [
                ("1g", "1g.23gb", _nominal_mib(23), 18),
                ("1g+me", "1g.23gb+me", _nominal_mib(23), 18),
                ("1g.2x", "1g.45gb", _nominal_mib(45), 18),
                ("2g", "2g.45gb", _nominal_mib(45), 36),
                ("3g", "3g.90gb", _nominal_mib(90), 54),
                ("4g", "4g.90gb", _nominal_mib(90), 72),
                ("7g", "7g.180gb", _nominal_mib(180), 126),
            ],
        ),
        exact=False,
    ),
)

MODEL_NAMES: tuple[str, ...] = tuple(m.name for m in MODELS)

# Short names that fit more than one model: an error that lists the candidates beats a guess.
_AMBIGUOUS: dict[str, tuple[str, ...]] = {"A100": ("A100-40GB", "A100-80GB")}


def _key(text: str) -> str:
    return text.strip().upper().replace("_", "-").replace(" ", "-")


_BY_KEY: dict[str, GpuModel] = {}
for _model in MODELS:
    for _name in (_model.name, *_model.aliases):
        _BY_KEY[_key(_name)] = _model


def get_model(name_or_alias: str) -> GpuModel:
    """The model called `name_or_alias` (case-insensitive), e.g. `H100` -> H100-80GB."""
    key = _key(name_or_alias)
    model = _BY_KEY.get(key)
    if model is not None:
        return model
    if key in _AMBIGUOUS:
        raise InvalidRequest(
            f"GPU model {name_or_alias!r} is ambiguous: say {' or '.join(_AMBIGUOUS[key])}"
        )
    raise InvalidRequest(f"unknown GPU model {name_or_alias!r}; known: {', '.join(MODEL_NAMES)}")


def get_profile(model: GpuModel | str, profile_name: str) -> MigProfile:
    """Profile `profile_name` of `model` (a GpuModel or a model name/alias)."""
    resolved = model if isinstance(model, GpuModel) else get_model(model)
    return resolved.profile(profile_name)


def find_model_by_device_name(nvml_name: str) -> GpuModel | None:
    """The model whose NVML device name is `nvml_name` (e.g. `NVIDIA H100 80GB HBM3`)."""
    wanted = nvml_name.strip().lower()
    for model in MODELS:
        if wanted in (n.lower() for n in (model.marketing_name, *model.other_names)):
            return model
    return None


def find_model_by_pci_device_id(device_id: str | int) -> GpuModel | None:
    """The model with PCI device id `device_id` (`0x233010DE` or the int NVML gives)."""
    value = normalize_pci_device_id(device_id)
    for model in MODELS:
        if value in model.pci_device_ids:
            return model
    return None


def normalize_pci_device_id(device_id: str | int) -> str:
    """`0x233010de`, `233010DE` or 0x233010DE -> `0x233010DE` (mig-parted's spelling)."""
    if isinstance(device_id, int):
        number = device_id
    else:
        text = device_id.strip()
        try:
            number = int(text, 16)
        except ValueError as err:
            raise InvalidRequest(
                f"invalid PCI device id {device_id!r}: use hex such as 0x233010DE"
            ) from err
    if not 0 <= number <= 0xFFFFFFFF:
        raise InvalidRequest(f"invalid PCI device id {device_id!r}: must fit in 32 bits")
    return f"0x{number:08X}"


class DriverTableRow(Protocol):
    """One row of a driver's GPU instance profile table (what the devices layer reads)."""

    @property
    def profile_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def slice_count(self) -> int: ...
    @property
    def sm_count(self) -> int: ...
    @property
    def instance_count(self) -> int: ...
    @property
    def placements(self) -> tuple[tuple[int, int], ...]: ...


def with_driver_table(model: GpuModel, rows: Sequence[DriverTableRow]) -> GpuModel:
    """`model` as the driver describes it: the driver's profiles, sizes, maxima and placements.

    The driver is the authority on a real GPU (a newer or older driver offers other profiles,
    and its memory sizes move between releases); the catalog fills in what a row lacks (the
    NVML constant, and placements when the driver gave none). An empty table leaves `model` as is.
    """
    profiles = [p for p in (_driver_profile(model, row) for row in rows) if p is not None]
    return replace(model, profiles=tuple(profiles), exact=True) if profiles else model


def _driver_profile(model: GpuModel, row: DriverTableRow) -> MigProfile | None:
    name = row.name.strip().lower().removeprefix("mig ").strip()
    known = model.profile(name) if model.has_profile(name) else None
    sizes = {size for _, size in row.placements}
    if len(sizes) == 1:
        memory_slices, starts = sizes.pop(), tuple(sorted(s for s, _ in row.placements))
    elif known is not None:
        memory_slices, starts = known.memory_slices, known.starts
    else:
        return None  # neither the driver nor the catalog says where it goes
    return MigProfile(
        name=name,
        nvml_profile=known.nvml_profile if known is not None else -1,
        smi_id=row.profile_id,
        compute_slices=row.slice_count,
        memory_slices=memory_slices,
        memory_mib=row.memory_mib,
        sm_count=row.sm_count,
        max_instances=row.instance_count,
        starts=starts,
    )
