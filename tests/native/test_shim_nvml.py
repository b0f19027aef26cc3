"""NVML memory queries inside a share report the share (what nvidia-smi and pynvml show).

NVML is a stand-in library (progs/shim_fake_nvml.c) installed as libnvidia-ml.so.1, reached
through pynvml, which loads it with ctypes: the lookups go through the library's dlsym hook.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shim_support import PROGS, compile_prog, make_node, shim_env

from gpupool.core.units import GiB

UUIDS = ("GPU-00000000-1111-2222-3333-444444444444", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")

QUERY = """
import ctypes, pynvml
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
ptr = ctypes.c_ulonglong()
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 30)) == 0
pynvml.nvmlInit()
for index in range(2):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    print(index, v1.total, v1.used, v1.free, v2.total, v2.used, v2.free)
"""


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvml")
    compile_prog(
        PROGS / "shim_fake_nvml.c",
        out / "libnvidia-ml.so.1",
        "-shared",
        "-fPIC",
        "-Wl,-soname,libnvidia-ml.so.1",
    )
    return out


def query(nvml_dir: Path, node: Path, visible: str) -> dict[int, list[int]]:
    env = shim_env(node, MEMORY_LIMIT="4GiB")
    env["LD_LIBRARY_PATH"] = f"{env['LD_LIBRARY_PATH']}:{nvml_dir}"
    env["CUDA_VISIBLE_DEVICES"] = visible
    out = subprocess.run(
        [sys.executable, "-c", QUERY], env=env, capture_output=True, text=True, check=True
    )
    rows = [list(map(int, line.split())) for line in out.stdout.splitlines()]
    return {row[0]: row[1:] for row in rows}


@pytest.mark.parametrize(
    "visible", ["1", "GPU-aaaaaaaa", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]
)
def test_nvml_reports_the_share_of_the_visible_gpu(
    nvml_dir: Path, tmp_path: Path, visible: str
) -> None:
    # the simulated GPUs carry the stand-in NVML's UUIDs, so CUDA and NVML agree on them
    node = make_node(tmp_path / "node", gpus=2, uuids=UUIDS)
    rows = query(nvml_dir, node, visible)
    share = [4 * GiB, GiB, 3 * GiB]
    untouched_v1 = [80 * GiB, 5 * GiB, 75 * GiB]
    untouched_v2 = [80 * GiB, 5 * GiB, 75 * GiB - GiB // 2]
    # NVML index 1 is CUDA ordinal 0 here, the share's GPU; index 0 is not visible to CUDA
    assert rows[1] == share + share
    assert rows[0] == untouched_v1 + untouched_v2


def test_a_program_linked_to_nvml_gets_the_share_too(nvml_dir: Path, tmp_path: Path) -> None:
    program = compile_prog(
        PROGS / "shim_nvml_direct.c",
        tmp_path / "nvml_direct",
        f"-L{nvml_dir}",
        "-l:libnvidia-ml.so.1",
    )
    env = shim_env(make_node(tmp_path / "node", gpus=2, uuids=UUIDS), MEMORY_LIMIT="2GiB")
    env["LD_LIBRARY_PATH"] = f"{env['LD_LIBRARY_PATH']}:{nvml_dir}"
    env["CUDA_VISIBLE_DEVICES"] = "0"
    out = subprocess.run([str(program)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        f"0 {2 * GiB} 0 {2 * GiB}",
        f"1 {80 * GiB} {5 * GiB} {75 * GiB}",
    ]


def test_nvml_devices_are_matched_to_cuda_by_uuid(nvml_dir: Path, tmp_path: Path) -> None:
    # CUDA enumerates the GPUs in another order than NVML (as CUDA_DEVICE_ORDER=FASTEST_FIRST
    # can): CUDA ordinal 0 is NVML index 1, and only ordinal 0 has a limit
    node = make_node(tmp_path / "node", gpus=2, uuids=UUIDS[::-1])
    env = shim_env(node, MEMORY_LIMIT_0="4GiB")
    env["LD_LIBRARY_PATH"] = f"{env['LD_LIBRARY_PATH']}:{nvml_dir}"
    out = subprocess.run(
        [sys.executable, "-c", QUERY], env=env, capture_output=True, text=True, check=True
    )
    rows = {int(r[0]): list(map(int, r[1:])) for r in map(str.split, out.stdout.splitlines())}
    assert rows[1] == [4 * GiB, GiB, 3 * GiB] * 2
    assert rows[0] == [80 * GiB, 5 * GiB, 75 * GiB, 80 * GiB, 5 * GiB, 75 * GiB - GiB // 2]
