"""`mig show` reports what the driver says, even layouts the catalog would not plan."""

from gpupool.cli.mig_cmd import describe_gpu
from gpupool.core.units import GiB
from gpupool.devices.snapshot import GpuSnapshot, MigInstance, MigState


def gpu(*instances: MigInstance, current: bool = True, pending: bool = True) -> GpuSnapshot:
    return GpuSnapshot(
        index=3,
        uuid="GPU-x",
        name="NVIDIA H100 80GB HBM3",
        model="H100-80GB",
        pci_bus_id="00000000:18:00.0",
        memory_total=80 * GiB,
        memory_used=0,
        memory_free=80 * GiB,
        utilization=None,
        temperature=None,
        power_w=None,
        mig=MigState(current, pending, instances),
    )


def test_free_slices_and_room() -> None:
    data, lines = describe_gpu(gpu(MigInstance(1, 0, "3g.40gb", 4, 4, 40 * GiB, "MIG-a")))
    assert data["free_slices"] == [0, 1, 2, 3]
    assert data["room"]["4g.40gb"] == 1 and "7g.80gb" not in data["room"]
    assert lines[0] == "GPU 3 (H100-80GB): MIG on"
    assert "3g.40gb      memory slices 4-7" in lines[1]


def test_a_layout_the_catalog_rejects_is_still_shown() -> None:
    odd = MigInstance(1, 0, "3g.40gb", 2, 4, 40 * GiB, None)  # 2 is no catalog start
    data, lines = describe_gpu(gpu(odd))
    assert data["free_slices"] == [0, 1, 6, 7] and "room" not in data
    assert "memory slices 2-5" in lines[1]


def test_unknown_placements_and_pending_mode() -> None:
    data, lines = describe_gpu(gpu(MigInstance(7, None, "1g.10gb", None, 1, 10 * GiB)))
    assert "free_slices" not in data
    assert "GI 7   CI -   1g.10gb      memory slices ?" in lines[1]
    _, lines = describe_gpu(gpu(current=False, pending=True))
    assert lines == ["GPU 3 (H100-80GB): MIG off, on after a GPU reset"]
