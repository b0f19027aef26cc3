"""The backend reads what a C process writes through native/include/gpupool_simstate.h."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.core.units import GiB
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.state import STATE_FILE
from gpupool.devices.snapshot import ProcessKind

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).parent / "c" / "fake_driver_client.c"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C client, built against the shared header with the project's compiler (gcc)."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc builds gpupool's native libraries and this test's client"
    binary = tmp_path_factory.mktemp("client") / "fake_driver_client"
    subprocess.run(
        [
            gcc,
            "-Wall",
            "-Werror",
            "-I",
            str(ROOT / "native" / "include"),
            str(SOURCE),
            "-o",
            str(binary),
        ],
        check=True,
    )
    return binary


def _start(client: Path, sim_node: SimulatedBackend, *extra: str) -> subprocess.Popen[str]:
    state = sim_node.node_dir / STATE_FILE
    process = subprocess.Popen(
        [str(client), str(state), "2", "7", str(3 * GiB), str(2 * 10**9), *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    ready = process.stdout.readline().split()
    assert ready[:2] == ["ready", "H100-80GB"], ready
    return process


@pytest.fixture
def c_process(client: Path, sim_node: SimulatedBackend) -> Iterator[subprocess.Popen[str]]:
    """The C client holding 3 GiB and 2 s of busy time on GPU 2, in slot 7."""
    process = _start(client, sim_node)
    yield process
    process.kill()
    process.wait()


def test_backend_sees_the_c_process(
    sim_node: SimulatedBackend, c_process: subprocess.Popen[str]
) -> None:
    gpu = sim_node.snapshot().gpus[2]
    (process,) = gpu.processes
    assert (process.pid, process.name, process.memory_used, process.kind) == (
        c_process.pid,
        "fake_driver_cli",  # /proc/PID/comm keeps 15 characters
        3 * GiB,
        ProcessKind.COMPUTE,
    )
    assert gpu.memory_used == 3 * GiB


def test_a_graphics_slot_written_in_c_reads_as_graphics(
    client: Path, sim_node: SimulatedBackend
) -> None:
    # the header's kind field and constant against simstate.py's
    process = _start(client, sim_node, "graphics")
    try:
        (listed,) = sim_node.snapshot().gpus[2].processes
        assert (listed.pid, listed.kind) == (process.pid, ProcessKind.GRAPHICS)
    finally:
        process.kill()
        process.wait()


def test_its_slot_dies_with_it(
    sim_node: SimulatedBackend, c_process: subprocess.Popen[str]
) -> None:
    c_process.kill()
    c_process.wait()
    gpu = sim_node.snapshot().gpus[2]
    assert gpu.processes == () and gpu.memory_used == 0
