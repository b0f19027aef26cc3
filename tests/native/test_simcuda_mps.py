"""MPS on a simulated node: the control daemon's twin and the simulated driver's MPS clients.

Real processes throughout: the twin started with `-d` as the real control daemon is, clients on
the simulated driver that connect to it at cuInit, servers killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.native.test_simcuda import create_sim_node, sim_dir, sim_env

from gpupool.devices.sim import mps_twin

__all__ = ["sim_dir"]  # the fixture that builds the simulated driver

ROOT = Path(__file__).resolve().parents[2]
CUDA_JOB = ROOT / "examples" / "cuda_job.py"
REQUEST_LOOP = ROOT / "examples" / "request_loop.py"
WORKLOAD_SOURCE = ROOT / "tests" / "native" / "progs" / "sim_workload.c"
CUDA_ERROR_MPS_SERVER_NOT_READY = 807


@dataclass
class Twin:
    pipe: Path
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*mps_twin.command(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=dict(os.environ, **self.env),
            timeout=30,
            check=False,
        )

    def ask(self, *commands: str) -> str:
        done = self.run(stdin="".join(f"{c}\n" for c in commands))
        assert done.returncode == 0, done.stderr
        return done.stdout

    def servers(self) -> list[int]:
        return [int(pid) for pid in self.ask("get_server_list").split()]


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Twin]:
    running = Twin(tmp_path / "pipe", tmp_path / "log")
    assert running.run("-d").returncode == 0
    yield running
    running.run(stdin="quit\n")


@pytest.fixture
def node(tmp_path: Path) -> Path:
    create_sim_node("1xH100", tmp_path / "node")
    return tmp_path / "node"


@pytest.fixture(scope="module")
def workload(sim_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("workload") / "sim_workload"
    subprocess.run(
        [
            *("gcc", "-O1", "-Wall", "-Werror", f"-I{ROOT / 'native' / 'include'}"),
            *("-o", str(exe), str(WORKLOAD_SOURCE), f"-L{sim_dir}", "-l:libcuda.so.1"),
        ],
        check=True,
    )
    return exe


def kernels(sim_dir: Path, node: Path, twin: Twin, percents: list[int]) -> list[int]:
    """Kernels each client (one per percentage, all at once) completes in one second."""
    jobs = [
        subprocess.Popen(
            [sys.executable, str(CUDA_JOB), "1", "64"],
            stdout=subprocess.PIPE,
            text=True,
            env=sim_env(sim_dir, node, **twin.env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(p)),
        )
        for p in percents
    ]
    counts = []
    for job in jobs:
        out, _ = job.communicate(timeout=60)
        assert job.returncode == 0, out
        counts.append(int(out.split("done: ")[1].split()[0]))
    return counts


def request_loops(
    sim_dir: Path,
    node: Path,
    twin: Twin,
    clients: list[tuple[int, int, str | None]],
    threads: int = 128,
) -> list[dict[str, float]]:
    """Request loops at once for 2 s, one per (percentage, blocks per kernel, client priority
    or None for the control daemon's default), blocks of `threads`; each one's RESULT."""
    loops = []
    for percent, blocks, priority in clients:
        env = sim_env(sim_dir, node, **twin.env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(percent))
        if priority is not None:
            env["CUDA_MPS_CLIENT_PRIORITY"] = priority
        command = [sys.executable, str(REQUEST_LOOP), "2", str(blocks), str(threads)]
        loops.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
    results = []
    for loop in loops:
        out, _ = loop.communicate(timeout=60)
        assert loop.returncode == 0, out
        results.append(json.loads(out.split("RESULT ")[1]))
    return results


REQUESTS = (50, 512)  # a 50 % client, 2 ms kernels on the whole GPU (4 ms at 50 %)
LONG_KERNELS = (100, 256 * 50)  # a 100 % client, 50 ms kernels back to back


@pytest.mark.serial
def test_a_normal_client_beside_a_below_normal_one_with_long_kernels_is_as_fast_as_alone(
    sim_dir: Path, node: Path, twin: Twin
) -> None:
    [alone] = request_loops(sim_dir, node, twin, [(*REQUESTS, None)])
    [low_alone] = request_loops(sim_dir, node, twin, [(*LONG_KERNELS, None)])
    equal, equal_low = request_loops(sim_dir, node, twin, [(*REQUESTS, "0"), (*LONG_KERNELS, "0")])
    # the SMs are oversubscribed (150 %): among equals a request waits for the long kernels
    assert equal["p50_ms"] > 5 * alone["p50_ms"]
    # below normal by the control daemon's default; the request loop sets its own normal
    assert twin.ask("set_default_client_priority 1", "get_default_client_priority") == "1\n"
    high, low = request_loops(sim_dir, node, twin, [(*REQUESTS, "0"), (*LONG_KERNELS, None)])
    assert high["p50_ms"] < 1.3 * alone["p50_ms"]
    assert high["requests"] > 0.8 * alone["requests"]
    # the below-normal client gets the SMs the normal one leaves: half of them, here
    assert 0.3 < low["rate"] / low_alone["rate"] < 0.75
    assert equal_low["requests"] > 0


def test_the_control_daemons_environment_sets_the_default_client_priority(tmp_path: Path) -> None:
    below = Twin(tmp_path / "pipe", tmp_path / "log")
    start = [*mps_twin.command(), "-d"]
    env = dict(os.environ, **below.env, CUDA_MPS_CLIENT_PRIORITY="1")
    assert subprocess.run(start, env=env, timeout=30, check=False).returncode == 0
    try:
        assert below.ask("get_default_client_priority") == "1\n"
    finally:
        below.run(stdin="quit\n")
    env["CUDA_MPS_CLIENT_PRIORITY"] = "low"
    assert subprocess.run(start, env=env, timeout=30, check=False).returncode == 1
    last = (below.log / "control.log").read_text().splitlines()[-1]
    assert "Failed to start: CUDA_MPS_CLIENT_PRIORITY 'low' is not 0 (normal) or 1" in last


def test_a_client_priority_is_0_or_1(sim_dir: Path, node: Path, twin: Twin) -> None:
    assert "not 0 (normal) or 1 (below normal)" in twin.ask("set_default_client_priority 2")
    env = sim_env(sim_dir, node, **twin.env, CUDA_MPS_CLIENT_PRIORITY="high")
    command = [sys.executable, str(REQUEST_LOOP), "0.1", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode != 0
    assert "CUDA_MPS_CLIENT_PRIORITY=high is not 0 (normal) or 1 (below normal)" in done.stderr


def test_the_twin_speaks_the_control_protocol_and_refuses_a_second_daemon(twin: Twin) -> None:
    uid = os.getuid()
    assert twin.servers() == []
    assert twin.ask("set_default_active_thread_percentage 40") == "40.0\n"
    twin.ask(f"start_server -uid {uid}")
    [server] = twin.servers()
    assert twin.ask(f"get_active_thread_percentage {server}") == "40.0\n"
    assert twin.ask(f"set_active_thread_percentage {server} 25") == "25.0\n"
    assert "unknown command" in twin.ask("no_such_command")
    assert twin.run("-d").returncode == 1
    assert "already running" in (twin.log / "control.log").read_text()
    assert "simulated" in (twin.log / "control.log").read_text()
    twin.ask("quit")
    deadline = time.monotonic() + 10
    while (twin.pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (twin.pipe / "control").exists()
    assert not Path(f"/proc/{server}").exists() or "Z" in Path(f"/proc/{server}/stat").read_text()
    assert twin.run(stdin="get_server_list\n").returncode == 1


@pytest.mark.serial
def test_a_kernel_is_slowed_by_a_percentage_only_below_the_sms_its_grid_fills(
    sim_dir: Path, node: Path, twin: Twin
) -> None:
    # 33 blocks of 1024 threads: a quarter of an H100's 132 SMs, about 1 ms on the whole GPU
    narrow = (33, None)
    [whole] = request_loops(sim_dir, node, twin, [(100, *narrow)], threads=1024)
    [quarter] = request_loops(sim_dir, node, twin, [(25, *narrow)], threads=1024)
    # the same work as 264 blocks of 128 threads fills every SM: 4 times as long on a quarter
    [wide] = request_loops(sim_dir, node, twin, [(25, 264, None)])
    assert quarter["p50_ms"] < 1.2 * whole["p50_ms"], (quarter, whole)
    assert wide["p50_ms"] > 3 * whole["p50_ms"], (wide, whole)
    # four quarters fill the GPU without slowing each other; a fifth oversubscribes it
    four = request_loops(sim_dir, node, twin, [(25, *narrow)] * 4, threads=1024)
    assert all(loop["p50_ms"] < 1.3 * quarter["p50_ms"] for loop in four), (four, quarter)
    five = request_loops(sim_dir, node, twin, [(25, *narrow)] * 5, threads=1024)
    assert sum(loop["rate"] for loop in five) < 4.5 * quarter["rate"], (five, quarter)


@pytest.mark.serial
def test_clients_30_and_70_run_at_once_each_as_fast_as_alone(
    sim_dir: Path, node: Path, twin: Twin
) -> None:
    [alone_30] = kernels(sim_dir, node, twin, [30])
    [alone_70] = kernels(sim_dir, node, twin, [70])
    together_30, together_70 = kernels(sim_dir, node, twin, [30, 70])
    # MPS provisions SMs: a 30% client runs at 30% of the SMs whoever else runs
    assert 0.35 < alone_30 / alone_70 < 0.5
    assert abs(together_30 - alone_30) / alone_30 < 0.05 * 100 / 30
    assert abs(together_70 - alone_70) / alone_70 < 0.05 * 100 / 70
    [server] = twin.servers()
    assert "New client" in (twin.log / "control.log").read_text()
    assert server > 0


def test_without_a_control_daemon_a_client_is_a_plain_context(
    sim_dir: Path, node: Path, tmp_path: Path
) -> None:
    absent = Twin(tmp_path / "nothing", tmp_path / "nolog")
    [plain] = kernels(sim_dir, node, absent, [30])
    assert plain > 500  # the whole GPU: the percentage means nothing without MPS


def test_a_killed_server_fails_its_clients_launches(
    sim_dir: Path, node: Path, twin: Twin, workload: Path
) -> None:
    client = subprocess.Popen(
        [str(workload), str(1 << 20)],
        stdout=subprocess.PIPE,
        text=True,
        env=sim_env(sim_dir, node, **twin.env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50"),
    )
    assert client.stdout is not None
    while "ready" not in client.stdout.readline():
        pass
    [server] = twin.servers()
    os.kill(server, signal.SIGKILL)
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 10
    assert f"rc={CUDA_ERROR_MPS_SERVER_NOT_READY}" in out
    deadline = time.monotonic() + 5
    while server in twin.servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "killed by signal 9" in (twin.log / "server.log").read_text()


def test_the_pinned_memory_limit_caps_a_client(
    sim_dir: Path, node: Path, twin: Twin, workload: Path
) -> None:
    env = sim_env(sim_dir, node, **twin.env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=512M")
    done = subprocess.run(
        [str(workload)], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert done.returncode == 10
    assert "cuMemAlloc_v2(&held, 1ull << 30) rc=2" in done.stdout


def gone_or_zombie(pid: int) -> bool:
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_a_server_goes_with_its_killed_control_daemon(twin: Twin) -> None:
    twin.ask(f"start_server -uid {os.getuid()}")
    [server] = twin.servers()
    control = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(control, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not gone_or_zombie(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone_or_zombie(server)
