"""`gpupool mig ...` as a user runs it: exit codes, one-line errors, JSON, a simulated node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = """\
version: v1
mig-configs:
  balanced:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 1
        "2g.20gb": 1
        "1g.10gb": 2
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices:
        "7g.80gb": 1
        "1g.10gb": 1
"""


def gpupool(*args: str, env_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("GPUPOOL_SIM_NODE", None)
    if env_dir is not None:
        env["XDG_RUNTIME_DIR"] = str(env_dir)
    return subprocess.run(
        [sys.executable, "-m", "gpupool", "mig", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_check_fits_prints_placements() -> None:
    result = gpupool("check", "--model", "H100", "3g.40gb:1,4g.40gb:1")
    assert result.returncode == 0, result.stderr
    assert "4g.40gb@0" in result.stdout and "3g.40gb@4" in result.stdout


def test_check_does_not_fit_exits_1_with_the_reason() -> None:
    result = gpupool("check", "--model", "A100-40GB", "4g.20gb:1,2g.10gb:2")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "gpupool: error: the layout needs 8 compute slices; A100-40GB has 7"
    )
    data = json.loads(gpupool("check", "-m", "A30", "4g.24gb,1g.6gb", "--json").stdout)
    assert data["fits"] is False and "needs 5 compute slices" in data["reason"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("check", "--model", "A100", "1g.5gb"), "ambiguous: say A100-40GB or A100-80GB"),
        (("check", "--model", "V100", "1g.5gb"), "unknown GPU model 'V100'; known: A30-24GB"),
        (("check", "--model", "H100", "3g.20gb"), "unknown MIG profile '3g.20gb' for H100-80GB"),
        (("check", "--model", "H100", "3g.40gb:x"), "invalid MIG layout item '3g.40gb:x'"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    result = gpupool(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_layouts_json_counts() -> None:
    data = json.loads(gpupool("layouts", "--model", "A30", "--json").stdout)
    assert len(data["layouts"]) == 5


def test_plan_apply_show_on_a_simulated_node(tmp_path: Path) -> None:
    config = tmp_path / "mig.yaml"
    config.write_text(CONFIG)
    node = ["--simulate", "2xH100-80GB"]
    plan = gpupool("plan", "-f", str(config), "-c", "balanced", *node, "--json", env_dir=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "simulated node" in plan.stderr
    data = json.loads(plan.stdout)
    assert data["simulated"] is True
    assert data["gpus"][0]["steps"][0] == "enable MIG mode"
    assert [p["start"] for p in data["gpus"][1]["final"]] == [0, 1, 2, 4]

    applied = gpupool("apply", "-f", str(config), "-c", "balanced", *node, env_dir=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert "GPU 1: create 3g.40gb@4" in applied.stdout

    shown = json.loads(gpupool("show", *node, "--json", env_dir=tmp_path).stdout)
    profiles = sorted(i["profile"] for i in shown["gpus"][0]["mig"]["instances"])
    assert profiles == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert shown["gpus"][0]["free_slices"] == []

    again = gpupool("apply", "-f", str(config), "-c", "balanced", *node, env_dir=tmp_path)
    assert "nothing to do" in again.stdout

    refused = gpupool("plan", "-f", str(config), "-c", "too-much", *node, env_dir=tmp_path)
    assert refused.returncode == 1
    assert "needs 8 compute slices; H100-80GB has 7" in refused.stderr


def test_config_errors_name_the_line(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("version: v1\nmig-configs:\n  a:\n    - devices: [0\n")
    result = gpupool("plan", "-f", str(config), "-c", "a", "--simulate", "1xA30", env_dir=tmp_path)
    assert result.returncode == 2
    assert f"{config}:5: malformed YAML" in result.stderr
    config.write_text(CONFIG)
    result = gpupool("plan", "-f", str(config), "-c", "x", "--simulate", "1xA30", env_dir=tmp_path)
    assert result.returncode == 2
    assert "no MIG config named 'x'; the file has: balanced, too-much" in result.stderr
    result = gpupool(
        "plan", "-f", str(config), "-c", "balanced", "--simulate", "1xA30", env_dir=tmp_path
    )
    assert result.returncode == 1
    assert "GPU 0 (A30-24GB) has no MIG profile '3g.40gb'" in result.stderr


def test_catalog_json_and_markdown() -> None:
    data = json.loads(gpupool("catalog", "--model", "A30", "--json").stdout)
    assert [p["name"] for p in data[0]["profiles"]][-1] == "4g.24gb"
    assert data[0]["profiles"][-1]["starts"] == [0]
    markdown = gpupool("catalog", "--markdown").stdout
    assert markdown.count("### ") == 7


def test_a_mig_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "mig.yaml"
    config.write_bytes(b"version: v1\n# caf\xe9\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpupool", "mig", "plan", "-f", str(config), "-c", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == f"gpupool: error: {config}:2: not UTF-8 text (byte b'\\xe9')\n"
