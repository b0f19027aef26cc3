"""`gpupool exec --gpu MIG-<uuid>`: a command on one MIG instance of a simulated node, its memory
share enforced by the interception library inside the instance."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from gpupool.mig import catalog
from test_cli_exec import SMOKE_SOURCE, built_native, env, gpupool

__all__ = ["built_native", "env"]  # fixtures, imported for pytest

SMALL = catalog.get_model("H100").profile("1g.10gb")


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text("gpus:\n  - model: H100\n    mig: [1g.10gb, 3g.40gb]\n  - model: H100\n")
    return str(path)


def instance_uuid(env: dict[str, str], spec: str, profile: str) -> str:
    shown = gpupool(env, "mig", "show", "--simulate", spec, "--json")
    assert shown.returncode == 0, shown.stderr
    instances = json.loads(shown.stdout)["gpus"][0]["mig"]["instances"]
    return str(next(i["uuid"] for i in instances if i["profile"] == profile))


def test_a_command_runs_on_the_instance_with_a_share_of_its_memory(
    env: dict[str, str], spec: str, tmp_path: Path
) -> None:
    exe = tmp_path / "sim_smoke"
    subprocess.run(["gcc", "-o", str(exe), str(SMOKE_SOURCE), "-ldl"], check=True)
    uuid = instance_uuid(env, spec, "1g.10gb")
    show = f"echo CVD=$CUDA_VISIBLE_DEVICES LIMIT=$GPUPOOL_MEMORY_LIMIT_0; {exe}"
    result = gpupool(
        env, "exec", "--simulate", spec, "--gpu", uuid, "--memory", "50%", "--", "sh", "-c", show
    )
    assert result.returncode == 0, result.stderr
    half = SMALL.memory_bytes // 2
    assert f"CVD={uuid} LIMIT={half}" in result.stdout
    # the library's limit is half the instance (not half the GPU), and the driver's device is it
    mib = half // 2**20
    assert f"GPU 0: NVIDIA H100 80GB HBM3 MIG 1g.10gb, {mib} MiB" in result.stdout
    assert f"memory: {mib} MiB free of {mib} MiB" in result.stdout
    line = result.stderr.splitlines()[-1]
    assert line.startswith("gpupool: MIG instance mig:1g.10gb@0/") and f"({half} bytes)" in line
    # 16 of the GPU's 132 SMs: the same kernels take about 8 times as long as on the whole GPU
    timed = re.search(r"10 kernels of 256x128 threads: ([0-9.]+) ms", result.stdout)
    assert timed is not None and 75.0 <= float(timed.group(1)) < 150.0  # 82.5 ms simulated


@pytest.mark.parametrize(
    ("gpu", "memory", "message"),
    [
        ("MIG-0000", None, "no MIG instance MIG-0000 on this node; its instances: MIG-"),
        ("1g", "20Gi", "memory share 20GiB (21474836480 bytes) is larger than MIG instance"),
        ("1g,3g", None, "--gpu takes one MIG instance"),
        ("0", None, "GPU 0 is in MIG mode: run on one of its instances with --gpu MIG-<uuid> "),
    ],
)
def test_bad_mig_input_is_one_line_and_nothing_runs(
    env: dict[str, str], spec: str, tmp_path: Path, gpu: str, memory: str | None, message: str
) -> None:
    uuids = {"1g": instance_uuid(env, spec, "1g.10gb"), "3g": instance_uuid(env, spec, "3g.40gb")}
    gpu = ",".join(uuids.get(part, part) for part in gpu.split(","))
    marker = tmp_path / "ran"
    args = ["--simulate", spec, "--gpu", gpu, *(["--memory", memory] if memory else [])]
    result = gpupool(env, "exec", *args, "--", "touch", str(marker))
    assert result.returncode == 125
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not marker.exists()
