"""The MIG catalog: facts from NVIDIA's MIG user guide and driver tables, and name lookup."""

import pytest

from gpupool.core.errors import InvalidRequest
from gpupool.mig import catalog
from gpupool.mig.catalog import get_model, get_profile


def test_seven_models_and_aliases() -> None:
    assert catalog.MODEL_NAMES == (
        "A30-24GB",
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "H100-94GB",
        "H200-141GB",
        "B200-180GB",
    )
    assert get_model("H100").name == "H100-80GB"
    assert get_model("h100-80gb").name == "H100-80GB"
    assert get_model("A30").name == "A30-24GB"
    assert get_model("H200").name == "H200-141GB"
    assert get_model("B200").name == "B200-180GB"


def test_a100_alone_is_ambiguous_and_names_both() -> None:
    with pytest.raises(InvalidRequest, match="A100-40GB or A100-80GB"):
        get_model("A100")


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(InvalidRequest, match=r"unknown GPU model 'V100'.*A30-24GB.*B200-180GB"):
        get_model("V100")


def test_unknown_profile_lists_the_models_profiles() -> None:
    with pytest.raises(InvalidRequest, match=r"'1g.5gb' for H100-80GB; known: 1g.10gb, "):
        get_profile("H100", "1g.5gb")


def test_a100_40gb_3g_starts_at_0_and_4_and_spans_four_memory_slices() -> None:
    profile = get_profile("A100-40GB", "3g.20gb")
    assert profile.starts == (0, 4)
    assert profile.memory_slices == 4
    assert profile.compute_slices == 3
    assert profile.max_instances == 2
    assert profile.sm_count == 42
    assert profile.nvml_profile == catalog.NVML_PROFILE_3_SLICE
    assert profile.smi_id == 9


def test_a30_4g_only_at_0_and_its_own_ids() -> None:
    a30 = get_model("A30")
    assert (a30.memory_slices, a30.compute_slices) == (4, 4)
    full = a30.profile("4g.24gb")
    assert full.starts == (0,)
    assert (full.nvml_profile, full.smi_id) == (catalog.NVML_PROFILE_4_SLICE, 0)
    assert a30.profile("2g.12gb+me").nvml_profile == catalog.NVML_PROFILE_2_SLICE_REV1
    assert a30.profile("1g.6gb").smi_id == 14
    assert a30.profile_names == ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb")


def test_h100_80gb_full_and_double_memory_1g() -> None:
    full = get_profile("H100", "7g.80gb")
    assert (full.starts, full.memory_slices, full.compute_slices) == ((0,), 8, 7)
    assert full.sm_count == 132
    assert full.nvml_profile == catalog.NVML_PROFILE_7_SLICE
    double = get_profile("H100", "1g.20gb")
    assert double.nvml_profile == catalog.NVML_PROFILE_1_SLICE_REV2
    assert double.starts == (0, 2, 4, 6)
    assert double.max_instances == 4
    me = get_profile("H100", "MIG 1g.10gb+me")
    assert me.media_extensions and me.max_instances == 1
    assert me.nvml_profile == catalog.NVML_PROFILE_1_SLICE_REV1


def test_profile_memory_fits_the_gpu_and_grows_with_slices() -> None:
    for model in catalog.MODELS:
        for profile in model.profiles:
            assert profile.memory_bytes <= model.memory_bytes, (model.name, profile.name)
            assert profile.sm_count <= model.sm_count
            assert all(s + profile.size <= model.memory_slices for s in profile.starts)
            gb = int(profile.name.split(".")[1].removesuffix("+me").removesuffix("gb"))
            # the name's size is the profile's memory in GB, rounded (9984 MiB -> 10gb)
            assert abs(profile.memory_bytes / 1e9 - gb) <= 0.15 * gb + 1, (model.name, profile)


def test_nvml_constants_match_pynvml() -> None:
    import pynvml  # nvidia-ml-py is a dependency: its constants are the reference

    assert catalog.NVML_PROFILE_7_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    assert catalog.NVML_PROFILE_1_SLICE_REV1 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    assert catalog.NVML_PROFILE_2_SLICE_REV1 == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
    assert catalog.NVML_PROFILE_1_SLICE_REV2 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert catalog.NVML_PROFILE_8_SLICE == pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE


def test_lookup_by_device_name_and_pci_id() -> None:
    assert catalog.find_model_by_device_name("NVIDIA H100 NVL") is get_model("H100-94GB")
    assert catalog.find_model_by_device_name("NVIDIA A100-PCIE-40GB") is get_model("A100-40GB")
    assert catalog.find_model_by_device_name("NVIDIA GeForce RTX 4090") is None
    assert catalog.find_model_by_pci_device_id("0x233010de") is get_model("H100")
    assert catalog.find_model_by_pci_device_id(0x20B710DE) is get_model("A30")
    assert get_model("H100").pci_device_id == "0x233010DE"
    with pytest.raises(InvalidRequest, match="invalid PCI device id 'zz'"):
        catalog.normalize_pci_device_id("zz")


class Row:
    """A driver table row as the devices layer reads it (nvmlGpuInstanceProfileInfo + places)."""

    def __init__(
        self,
        name: str,
        pid: int,
        slices: int,
        mib: int,
        sms: int,
        count: int,
        placements: tuple[tuple[int, int], ...],
    ) -> None:
        self.name, self.profile_id, self.slice_count = name, pid, slices
        self.memory_mib, self.sm_count, self.instance_count = mib, sms, count
        self.placements = placements


def test_the_driver_table_overrides_the_catalog() -> None:
    h200 = get_model("H200")
    rows = [
        Row("MIG 1g.18gb", 19, 1, 16384, 16, 7, tuple((s, 1) for s in range(7))),
        Row("MIG 3g.71gb", 9, 3, 70656, 60, 2, ((0, 4), (4, 4))),
        Row("MIG 1g.18gb-me", 21, 1, 16384, 16, 7, tuple((s, 1) for s in range(7))),
        Row("MIG 7g.141gb", 0, 7, 143360, 132, 1, ()),
    ]
    driven = catalog.with_driver_table(h200, rows)
    assert driven.exact and driven.profile_names == ("1g.18gb", "3g.71gb", "1g.18gb-me", "7g.141gb")
    assert driven.profile("1g.18gb").memory_mib == 16384
    assert driven.profile("3g.71gb").starts == (0, 4)
    added = driven.profile("1g.18gb-me")
    assert (added.nvml_profile, added.smi_id, added.memory_slices) == (-1, 21, 1)
    full = driven.profile("7g.141gb")  # no placements from the driver: the catalog's
    assert (full.starts, full.memory_slices, full.memory_mib) == ((0,), 8, 143360)
    assert not driven.has_profile("2g.35gb")  # the driver does not offer it
    assert catalog.with_driver_table(h200, []) is h200
