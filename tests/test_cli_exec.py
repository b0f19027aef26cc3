"""`gpupool exec` end to end: a real command under a share on a simulated node."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.devices.sim.spec import parse_spec
from gpupool.mig import catalog

ROOT = Path(__file__).resolve().parents[1]
SMOKE_SOURCE = ROOT / "tests" / "native" / "progs" / "sim_smoke.c"


@pytest.fixture(scope="module", autouse=True)
def built_native() -> None:
    """`gpupool exec` preloads the interception library: build both libraries (incremental)."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_"))}
    clean["XDG_RUNTIME_DIR"] = str(tmp_path)  # simulated nodes go here
    return clean


def default_node(tmp_path: Path, spec: str) -> Path:
    """Where the devices layer puts the node of `spec` under XDG_RUNTIME_DIR=tmp_path."""
    return tmp_path / "gpupool-sim" / parse_spec(spec).key


def gpupool(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_exit_code_and_announcement(env: dict[str, str], tmp_path: Path) -> None:
    result = gpupool(env, "exec", "--simulate", "1xH100", "--", "sh", "-c", "exit 7")
    assert result.returncode == 7
    node = default_node(tmp_path, "1xH100")
    assert result.stderr == (
        f"gpupool: simulated node 1xH100 (H100-80GB) at {node}: no real GPU is used\n"
    )
    assert (node / "state.bin").is_file() and (node / "node.json").is_file()


def test_the_launch_line_prints_the_resolved_size(env: dict[str, str]) -> None:
    """`4G` is 10^9-based and `4Gi` 2^30-based, as in Kubernetes; the launch line says which."""
    for size, resolved in (("4G", "3.7GiB (4000000000 bytes)"), ("4Gi", "4GiB (4294967296 bytes)")):
        args = ["--simulate", "1xH100", "--memory", size, "--compute", "1"]
        result = gpupool(env, "exec", *args, "--", "sh", "-c", "echo $GPUPOOL_MEMORY_LIMIT_0")
        assert result.returncode == 0, result.stderr
        line = result.stderr.splitlines()[-1]
        assert line == f"gpupool: GPU 0 (H100-80GB): memory {resolved}; compute 1% (cap)"
        assert result.stdout.strip() == resolved.split("(")[1].split()[0]


def test_a_signal_becomes_128_plus_n(env: dict[str, str]) -> None:
    result = gpupool(env, "exec", "--simulate", "1xH100", "--", "sh", "-c", "kill -TERM $$")
    assert result.returncode == 128 + 15


def test_the_child_sees_the_share(env: dict[str, str], tmp_path: Path) -> None:
    show = "; ".join(
        f"echo {name}=${name}"
        for name in (
            "CUDA_VISIBLE_DEVICES",
            "GPUPOOL_MEMORY_LIMIT_0",
            "GPUPOOL_COMPUTE_LIMIT",
            "GPUPOOL_COMPUTE_POLICY",
            "GPUPOOL_COMPUTE_PRIORITY",
            "GPUPOOL_SIM_NODE",
            "GPUPOOL_SHARED_REGION",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
        )
    )
    args = ["--simulate", "2xA100-40GB", "--gpu", "1", "--memory", "25%", "--compute", "30"]
    args += ["--compute-policy", "share", "--priority", "low"]
    result = gpupool(env, "exec", *args, "--", "sh", "-c", show)
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"
    assert seen["GPUPOOL_MEMORY_LIMIT_0"] == str(catalog.get_model("A100-40GB").memory_bytes // 4)
    assert (seen["GPUPOOL_COMPUTE_LIMIT"], seen["GPUPOOL_COMPUTE_POLICY"]) == ("30", "share")
    assert seen["GPUPOOL_COMPUTE_PRIORITY"] == "low"
    assert seen["GPUPOOL_SIM_NODE"] == str(default_node(tmp_path, "2xA100-40GB"))
    assert seen["LD_PRELOAD"].endswith("_native/libgpupool-cuda.so")
    assert seen["LD_LIBRARY_PATH"].endswith("_native/sim")
    region = Path(seen["GPUPOOL_SHARED_REGION"])
    assert not region.parent.exists()  # the share's private directory is removed afterwards


def test_a_cuda_program_sees_its_share(env: dict[str, str], tmp_path: Path) -> None:
    exe = tmp_path / "sim_smoke"
    subprocess.run(["gcc", "-o", str(exe), str(SMOKE_SOURCE), "-ldl"], check=True)
    result = gpupool(env, "exec", "--simulate", "1xH100", "--memory", "4GiB", "--", str(exe))
    assert result.returncode == 0, result.stderr
    assert "GPU 0: NVIDIA H100 80GB HBM3, 4096 MiB" in result.stdout
    assert "memory: 4096 MiB free of 4096 MiB" in result.stdout
    timed = re.search(r"10 kernels of 256x128 threads: ([0-9.]+) ms", result.stdout)
    assert timed is not None and 10.0 <= float(timed.group(1)) < 15.0


def test_inherited_settings_and_arbiter_directories_do_not_reach_the_command(
    env: dict[str, str], tmp_path: Path
) -> None:
    exe = tmp_path / "sim_smoke"
    subprocess.run(["gcc", "-o", str(exe), str(SMOKE_SOURCE), "-ldl"], check=True)
    stray = tmp_path / "stray.conf"  # the library would take its limit from here
    stray.write_text("GPUPOOL_MEMORY_LIMIT=1MiB\n")
    env["GPUPOOL_CONFIG_FILE"] = str(stray)
    env["GPUPOOL_ARBITER_DIR"] = "not-an-absolute-path"  # the library would refuse it
    result = gpupool(env, "exec", "--simulate", "1xH100", "--memory", "4GiB", "--", str(exe))
    assert result.returncode == 0, result.stderr
    assert "memory: 4096 MiB free of 4096 MiB" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "4XB"], "invalid memory size '4XB'"),
        (["--memory", "0"], "invalid memory size '0'"),
        (["--compute", "150"], "invalid compute share '150'"),
        (["--compute", "0"], "invalid compute share '0'"),
        (["--compute", "101"], "invalid compute share '101'"),
        (["--compute", "0.5"], "invalid compute share '0.5'"),
        (["--compute=-3"], "invalid compute share '-3'"),
        (["--compute", "abc"], "invalid compute share 'abc'"),
        (["--memory", "4096"], "4096 bytes is below 1Mi; did you mean 4096Mi?"),
        (["--memory", "4g"], "did you mean G?"),
        (["--memory", "100Gi"], "is larger than GPU 0 (H100-80GB, 79.6GiB)"),
        (["--gpu", "3"], "invalid GPU index 3: this node has GPUs 0..0"),
        (["--gpu", "x"], "invalid GPU index"),
        (["--compute-policy", "fair"], "invalid compute policy 'fair'"),
        (["--priority", "urgent"], "invalid priority 'urgent': use high or low"),
        (["--simulate", "3xV100"], "unknown GPU model 'V100'"),
    ],
)
def test_bad_input_is_one_line_and_nothing_runs(
    env: dict[str, str], tmp_path: Path, args: list[str], message: str
) -> None:
    marker = tmp_path / "ran"
    if "--simulate" not in args:
        args = ["--simulate", "1xH100", *args]
    result = gpupool(env, "exec", *args, "--", "touch", str(marker))
    assert result.returncode == 125  # exec's own failure, as env(1) reports one
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not marker.exists()


def test_unknown_option_is_exec_failure_not_the_commands_status(
    env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    refused = gpupool(env, "exec", "--simulate", "1xH100", "--bogus", "--", "touch", str(marker))
    assert refused.returncode == 125
    assert "--bogus" in refused.stderr and "Traceback" not in refused.stderr
    assert not marker.exists()
    # a command that itself exits 2 (a usage error of its own) keeps its status
    passed = gpupool(env, "exec", "--simulate", "1xH100", "--", "sh", "-c", "exit 2")
    assert passed.returncode == 2


def test_missing_command(env: dict[str, str]) -> None:
    result = gpupool(env, "exec", "--simulate", "1xH100", "--", "no-such-command-gpupool")
    assert result.returncode == 127
    assert "command not found: no-such-command-gpupool" in result.stderr


def _has_nvidia_driver() -> bool:
    if not any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/dxg")):
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_one_clear_line(env: dict[str, str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = gpupool(env, "exec", "--", "touch", str(marker))
    assert result.returncode == 125
    assert result.stderr.startswith("gpupool: error: NVIDIA driver not found")
    assert result.stderr.count("\n") == 1
    assert not marker.exists()


def test_mode_mps_is_refused_in_one_line_pointing_at_the_daemon(
    env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = gpupool(
        env, "exec", "--mode", "mps", "--simulate", "1xH100", "--", "touch", str(marker)
    )
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1
    assert "gpupool submit --mode mps" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "gpupool-sim").exists()  # refused before the node was even made


def test_a_relative_node_dir_works_as_an_absolute_one(env: dict[str, str], tmp_path: Path) -> None:
    # the node's path reaches the share's environment (its arbiter directory), which needs it
    # absolute, whatever directory the command was started from
    args = ["--simulate", "1xA30", "--node-dir", "nd", "--compute", "30", "--priority", "high"]
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "exec", *args, "--", "true"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "nd" / "node.json").exists()
