"""The launch spec of a share and the library locator."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidRequest, NativeLibraryError
from gpupool.core.units import GiB, MemoryShare
from gpupool.isolation.arbiter_control import ArbiterShare, Registration
from gpupool.isolation.launch import (
    ComputePolicy,
    ShareLimits,
    build_launch_spec,
    memory_bytes,
    new_shared_region,
)
from gpupool.isolation.libraries import shim_library, sim_driver_dir


@pytest.fixture
def native(tmp_path: Path) -> Path:
    """A native directory laid out as `make native` lays it out."""
    root = tmp_path / "_native"
    (root / "sim").mkdir(parents=True)
    (root / "libgpupool-cuda.so").write_bytes(b"")
    (root / "libgpupool-simcuda.so").write_bytes(b"")
    (root / "sim" / "libcuda.so.1").write_bytes(b"")
    return root


def test_missing_libraries_say_how_to_build_them(tmp_path: Path) -> None:
    with pytest.raises(
        NativeLibraryError, match=r"libgpupool-cuda\.so is missing: run `make native`"
    ):
        shim_library(tmp_path)
    with pytest.raises(NativeLibraryError, match=r"libcuda\.so\.1 is missing.*reinstall gpupool"):
        sim_driver_dir(tmp_path)


def test_located_libraries(native: Path) -> None:
    assert shim_library(native) == native / "libgpupool-cuda.so"
    assert sim_driver_dir(native) == native / "sim"


def test_share_environment(native: Path, tmp_path: Path) -> None:
    limits = ShareLimits((1, 2), MemoryShare(fraction=0.5), 300, ComputePolicy.SHARE)
    spec = build_launch_spec(
        ["python", "train.py"],
        limits,
        gpu_totals=[80 * GiB, 40 * GiB],
        base_env={"PATH": "/bin", "LD_PRELOAD": "/opt/other.so", "GPUPOOL_LOG_LEVEL": "debug"},
        shared_region=tmp_path / "region",
        native_dir=native,
    )
    assert spec.argv == ("python", "train.py")
    assert dict(spec.env) == {
        "PATH": "/bin",
        "GPUPOOL_LOG_LEVEL": "debug",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1,2",
        "GPUPOOL_MEMORY_LIMIT_0": str(40 * GiB),  # ordinals count the visible GPUs
        "GPUPOOL_MEMORY_LIMIT_1": str(20 * GiB),
        "GPUPOOL_COMPUTE_LIMIT": "30",
        "GPUPOOL_COMPUTE_POLICY": "share",
        "GPUPOOL_SHARED_REGION": str(tmp_path / "region"),
        "LD_PRELOAD": f"{native / 'libgpupool-cuda.so'}:/opt/other.so",
    }
    # registered with an arbiter: its directory and the share's name there
    share = ArbiterShare(0x1234, 0xABCD)
    arbitrated = build_launch_spec(
        ["prog"],
        limits,
        gpu_totals=[80 * GiB, 40 * GiB],
        native_dir=native,
        arbiter=(Path("/run/gpupool/arbiter"), share),
    )
    assert arbitrated.env["GPUPOOL_ARBITER_DIR"] == "/run/gpupool/arbiter"
    assert arbitrated.env["GPUPOOL_ARBITER_SHARE"] == "0000000000001234:000000000000abcd"
    assert limits.arbitrated and limits.percent == 30
    registration = limits.registration(share, 1000, ["GPU-a", "GPU-b", "GPU-c"])
    assert registration == Registration(share, 1000, ("GPU-b", "GPU-c"), 30, None, "share")


def test_simulated_node_environment(native: Path, tmp_path: Path) -> None:
    spec = build_launch_spec(
        ["prog"],
        ShareLimits((0,), 4 * GiB),
        sim_node=tmp_path / "node",
        base_env={"LD_LIBRARY_PATH": "/usr/local/lib"},
        native_dir=native,
    )
    assert spec.env["LD_LIBRARY_PATH"] == f"{native / 'sim'}:/usr/local/lib"
    assert "GPUPOOL_ARBITER_DIR" not in spec.env  # no compute limit, no priority: no arbiter
    assert spec.env["GPUPOOL_SIM_NODE"] == str(tmp_path / "node")
    assert spec.env["GPUPOOL_MEMORY_LIMIT_0"] == str(4 * GiB)
    assert "GPUPOOL_COMPUTE_LIMIT" not in spec.env  # a whole GPU's compute: no throttling
    assert spec.env["GPUPOOL_COMPUTE_POLICY"] == "cap"


def test_inherited_limits_do_not_leak_into_a_share(native: Path) -> None:
    inherited = {
        "GPUPOOL_MEMORY_LIMIT": "1GiB",
        "GPUPOOL_MEMORY_LIMIT_3": "1GiB",
        "GPUPOOL_COMPUTE_LIMIT_0": "10",
        "GPUPOOL_SIM_KERNEL_NS": "5000000",
        "GPUPOOL_CONFIG_FILE": "/elsewhere/shim.conf",
        "GPUPOOL_ARBITER_DIR": "/elsewhere",
        "GPUPOOL_ARBITER_SHARE": "0000000000000001:0000000000000002",
    }
    spec = build_launch_spec(["prog"], ShareLimits((0,)), base_env=inherited, native_dir=native)
    assert not any(
        k.startswith(("GPUPOOL_MEMORY_LIMIT", "GPUPOOL_COMPUTE_LIMIT")) for k in spec.env
    )
    assert "GPUPOOL_CONFIG_FILE" not in spec.env
    # another share's name at the arbiter is never inherited
    assert "GPUPOOL_ARBITER_DIR" not in spec.env and "GPUPOOL_ARBITER_SHARE" not in spec.env
    assert spec.env["GPUPOOL_SIM_KERNEL_NS"] == "5000000"


def test_each_launch_gets_a_private_shared_region(tmp_path: Path) -> None:
    first, second = new_shared_region(tmp_path), new_shared_region(tmp_path)
    assert first != second
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    assert not first.exists()  # the interception library creates it


def test_memory_bytes() -> None:
    assert memory_bytes(None, None) is None
    assert memory_bytes(5, None) == 5
    assert memory_bytes(MemoryShare(bytes=7), None) == 7
    assert memory_bytes(MemoryShare(fraction=0.25), 80 * GiB) == 20 * GiB
    with pytest.raises(InvalidRequest, match="fraction"):
        memory_bytes(MemoryShare(fraction=0.25), None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": ()}, "at least one GPU"),
        ({"gpus": (0, 0)}, "distinct"),
        ({"gpus": (-1,)}, "distinct"),
        ({"gpus": (0,), "compute_milli": 0}, "compute 0"),
        ({"gpus": (0,), "compute_milli": 1001}, "compute 1001"),
        ({"gpus": (0,), "memory": 0}, "memory 0"),
    ],
)
def test_bad_limits(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        ShareLimits(**kwargs)  # type: ignore[arg-type]


def test_a_launch_needs_a_command(native: Path) -> None:
    with pytest.raises(InvalidRequest, match="no command"):
        build_launch_spec([], ShareLimits((0,)), native_dir=native)
