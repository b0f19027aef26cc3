"""Scenario fixtures shared by all tests: simulated nodes and what can happen on them."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool.core.units import GiB
from gpupool.devices.procfs import process_start_time
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.spec import ENV_NODE_DIR
from gpupool.devices.sim.state import (
    FLAG_LOST,
    FLAG_NOT_SUPPORTED,
    SimProcSlot,
)

#: the node most scenarios use: two A30s and an H100
SIM_SPEC = "2xA30,1xH100-80GB"


@pytest.fixture(autouse=True)
def _temporary_files_stay_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a test or the processes it starts put in a temporary directory (a share's
    private directory, a simulated node) lands in its own tmp_path, which pytest removes, and
    never in the machine's /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


@pytest.fixture
def sim_node_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory for a simulated node; $GPUPOOL_SIM_NODE cleared so nothing leaks in."""
    monkeypatch.delenv(ENV_NODE_DIR, raising=False)
    return tmp_path / "node"


@pytest.fixture
def sim_node(sim_node_dir: Path) -> Iterator[SimulatedBackend]:
    """A simulated node of SIM_SPEC, idle, opened as a backend."""
    backend = SimulatedBackend.open(SIM_SPEC, sim_node_dir)
    yield backend
    backend.close()


@pytest.fixture
def sim_node_env(sim_node: SimulatedBackend, monkeypatch: pytest.MonkeyPatch) -> SimulatedBackend:
    """The `sim_node`, named by $GPUPOOL_SIM_NODE as for processes on the simulated driver."""
    monkeypatch.setenv(ENV_NODE_DIR, str(sim_node.node_dir))
    return sim_node


@pytest.fixture
def sim_gpu_lost(sim_node: SimulatedBackend) -> SimulatedBackend:
    """GPU 0 of the node fell off the bus."""
    sim_node.node.state.set_flags(0, FLAG_LOST)
    return sim_node


@pytest.fixture
def sim_not_supported(sim_node: SimulatedBackend) -> SimulatedBackend:
    """GPU 1 answers NotSupported for utilisation, temperature and power."""
    sim_node.node.state.set_flags(1, FLAG_NOT_SUPPORTED)
    return sim_node


@dataclass(frozen=True)
class LiveProcess:
    """A real process holding memory on simulated GPU `gpu` (slot `slot`)."""

    process: subprocess.Popen[bytes]
    gpu: int
    slot: int
    memory_used: int

    @property
    def pid(self) -> int:
        return self.process.pid


def _start_sleeper() -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(["sleep", "300"])
    start = process_start_time(process.pid)
    assert start is not None
    return process, start


@pytest.fixture
def sim_live_process(sim_node: SimulatedBackend) -> Iterator[LiveProcess]:
    """A running `sleep` using 2 GiB on GPU 0, written in its slot as the driver would."""
    process, start = _start_sleeper()
    memory = 2 * GiB
    state = sim_node.node.state
    state.write_proc(0, SimProcSlot(0, process.pid, 0, start, memory, 0, 0))
    state.set_gpu_usage(0, memory, 0)
    yield LiveProcess(process, 0, 0, memory)
    process.kill()
    process.wait()


@dataclass(frozen=True)
class VanishedPids:
    """Slots whose processes are gone: `exited` ended, `reused` is a pid with another process."""

    exited: int
    reused: int
    memory_used: int


@pytest.fixture
def sim_vanished_pids(sim_node: SimulatedBackend) -> VanishedPids:
    """GPU 0 holds slots of an exited process and of a reused pid, 1 GiB each, counted in use."""
    process, start = _start_sleeper()
    process.kill()
    process.wait()
    own_start = process_start_time(os.getpid())
    assert own_start is not None
    state = sim_node.node.state
    memory = 1 * GiB
    state.write_proc(5, SimProcSlot(5, process.pid, 0, start, memory, 10**6, 0))
    # this test process's pid with another start time: the slot's process was a predecessor
    state.write_proc(6, SimProcSlot(6, os.getpid(), 0, own_start - 1, memory, 10**6, 0))
    state.set_gpu_usage(0, 2 * memory, 2 * 10**6)
    return VanishedPids(process.pid, os.getpid(), memory)
