"""`gpupool gpus` through a real subprocess: JSON schema, table, errors, watch, no driver."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.mig import catalog


def gpupool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=60,
    )


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """No simulated node named by the environment, no daemon to ask for one; per-test default
    node directories."""
    env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_SIM_NODE"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["GPUPOOL_URL"] = f"unix://{tmp_path / 'no-daemon.sock'}"
    return env


def test_json_schema(clean_env: dict[str, str]) -> None:
    result = gpupool("gpus", "--simulate", "2xA30", "--json", env=clean_env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["simulated"] is True and data["driver"] == "simulated"
    assert len(data["gpus"]) == 2
    gpu = data["gpus"][1]
    assert gpu["index"] == 1 and gpu["model"] == "A30-24GB" and gpu["name"] == "NVIDIA A30"
    assert gpu["uuid"].startswith("GPU-")
    assert gpu["memory_total"] == catalog.get_model("A30").memory_bytes
    assert gpu["memory_used"] == 0 and gpu["utilization"] == 0
    assert gpu["mig"] == {"current": False, "pending": False, "instances": []}
    assert gpu["processes"] == []
    assert Path(data["node_dir"]).parent == Path(clean_env["XDG_RUNTIME_DIR"]) / "gpupool-sim"


def test_json_lists_a_live_process(
    sim_node: SimulatedBackend, sim_live_process: Any, clean_env: dict[str, str]
) -> None:
    node_dir = sim_node.node_dir
    result = gpupool("gpus", "--node-dir", str(node_dir), "--json", env=clean_env)
    assert result.returncode == 0, result.stderr
    processes = json.loads(result.stdout)["gpus"][0]["processes"]
    assert [(p["pid"], p["memory_used"]) for p in processes] == [
        (sim_live_process.pid, sim_live_process.memory_used)
    ]


def test_table_announces_simulation(sim_node: SimulatedBackend, clean_env: dict[str, str]) -> None:
    node = sim_node.node_dir
    sim_node.set_mig_mode(2, True)
    sim_node.create_gpu_instance(2, "3g.40gb", 4)
    env = dict(clean_env, COLUMNS="200")
    result = gpupool("gpus", "--node-dir", str(node), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"simulated node {node} (simulated GPUs)")
    for text in ("H100-80GB", "GPUs", "MIG instances", "3g.40gb", "4:4"):
        assert text in result.stdout
    assert "no processes" in result.stdout


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("2xA100", "gpupool: error: GPU model 'A100' is ambiguous: say A100-40GB or A100-80GB"),
        ("3xT4", "gpupool: error: unknown GPU model 'T4'; known: A30-24GB, A100-40GB, A100-80GB"),
        ("2 x", "gpupool: error: invalid simulated node spec '2 x'"),
    ],
)
def test_bad_spec_is_one_line(spec: str, line: str, clean_env: dict[str, str]) -> None:
    result = gpupool("gpus", "--simulate", spec, env=clean_env)
    assert result.returncode == 2
    assert result.stderr.startswith(line)
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def _nvidia_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_nvml_path_without_simulate(clean_env: dict[str, str]) -> None:
    result = gpupool("gpus", env=clean_env)
    if _nvidia_library_loads():  # a machine with the driver: the real GPUs, announced as such
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("NVIDIA driver ")
        return
    # no NVIDIA driver here: the NVML path must say so in one line
    assert result.returncode == 4, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gpupool: error: NVIDIA driver not found: ")
    assert line.endswith(
        "Install the NVIDIA driver, or use --simulate SPEC (e.g. --simulate 8xH100-80GB) "
        "to run on simulated GPUs (--node-dir DIR or $GPUPOOL_SIM_NODE for an existing "
        "simulated node, such as a daemon's)."
    )
    assert result.stdout == ""


def test_seconds_without_watch(clean_env: dict[str, str]) -> None:
    result = gpupool("gpus", "--simulate", "A30", "3", env=clean_env)
    assert result.returncode == 2
    assert "SECONDS 3 needs --watch" in result.stderr


@pytest.mark.parametrize("seconds", ["0", "nan", "inf"])
def test_bad_watch_interval(seconds: str, clean_env: dict[str, str]) -> None:
    result = gpupool("gpus", "--simulate", "A30", "--watch", seconds, env=clean_env)
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpupool: error: invalid watch interval {seconds}")


def _watch(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "gpus", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(2.5)  # start-up, then a few refreshes
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


def test_watch_json_refreshes_until_ctrl_c(clean_env: dict[str, str]) -> None:
    code, out, err = _watch(["--simulate", "A30", "--json", "--watch", "0.2"], clean_env)
    assert code == 0, err
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) >= 2
    assert documents[0]["gpus"][0]["model"] == "A30-24GB"
    assert documents[1]["timestamp"] > documents[0]["timestamp"]


def test_the_table_fits_80_columns_with_every_gpu_and_instance(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    inventory = tmp_path / "node.yaml"
    inventory.write_text(
        "gpus:\n  - model: H100-80GB\n    count: 2\n"
        "    mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]\n  - model: A100-40GB\n    count: 6\n"
    )
    env = dict(clean_env, COLUMNS="80")
    result = gpupool("gpus", "--simulate", str(inventory), env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    # one unwrapped line per GPU and per MIG instance, each with its whole UUID
    assert sum("H100-80GB" in line for line in lines) == 2
    assert sum("A100-40GB" in line for line in lines) == 6
    assert len(re.findall(r"MIG-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", result.stdout)) == 8
    head = result.stdout.split("\nGPUs")[0]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", head), "the header is timestamped"


def test_watch_table_exits_0_on_ctrl_c(clean_env: dict[str, str]) -> None:
    code, out, err = _watch(["--simulate", "A30", "--watch", "0.2"], clean_env)
    assert code == 0, err
    assert "simulated node" in out and "Traceback" not in err
