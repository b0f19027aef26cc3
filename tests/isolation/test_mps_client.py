"""An MPS client's settings, and which control program a node runs."""

from __future__ import annotations

from pathlib import Path

from gpupool.agent.mps import REAL_CONTROL, control_command
from gpupool.core.resources import Priority
from gpupool.core.units import GiB, MiB
from gpupool.devices.sim import mps_twin
from gpupool.isolation.mps import mps_client_env, thread_percentage


def test_a_compute_share_is_a_whole_thread_percentage() -> None:
    assert [thread_percentage(m) for m in (1, 4, 5, 300, 700, 1000)] == [1, 1, 1, 30, 70, 100]


def test_the_client_names_its_server_its_gpu_its_share_and_a_backstop_above_it() -> None:
    env = mps_client_env(Path("/state/mps/0/pipe"), "GPU-1234", 300, 4 * GiB, Priority.HIGH)
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": "/state/mps/0/pipe",
        "CUDA_VISIBLE_DEVICES": "GPU-1234",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_CLIENT_PRIORITY": "0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={(4 * GiB + GiB) // MiB}M",
    }
    whole = mps_client_env(Path("/p"), "0", 1000, None, Priority.HIGH)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in whole


def test_a_low_job_is_a_below_normal_client_and_a_high_one_explicitly_normal() -> None:
    low = mps_client_env(Path("/p"), "0", 500, None, Priority.LOW)
    high = mps_client_env(Path("/p"), "0", 500, None, Priority.HIGH)
    assert (low["CUDA_MPS_CLIENT_PRIORITY"], high["CUDA_MPS_CLIENT_PRIORITY"]) == ("1", "0")


def test_real_gpus_run_nvidias_control_simulated_ones_the_twin_unless_named() -> None:
    assert control_command(False, {}) == [REAL_CONTROL]
    assert control_command(True, {}) == mps_twin.command()
    named = {"GPUPOOL_MPS_CONTROL": "/opt/mps/control --flag"}
    assert control_command(True, named) == ["/opt/mps/control", "--flag"]
