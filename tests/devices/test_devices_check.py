"""bench/gpu/devices_check.py: read-only, compares catalog and driver, fails well without one."""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from nvml_fake import FakeNvml

from gpupool.devices.nvml import NvmlBackend
from gpupool.devices.nvml_lib import Nvml
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.mig import catalog

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "devices_check.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devices_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_catalog_matches_its_own_table(sim_node: SimulatedBackend) -> None:
    check = load_script()
    assert check.compare(catalog.get_model("H100"), sim_node.mig_profile_table(2)) == []


def test_differences_are_named(sim_node: SimulatedBackend) -> None:
    check = load_script()
    table = sim_node.mig_profile_table(2)
    table[0] = dataclasses.replace(table[0], memory_mib=1, placements=((0, 1),))
    extra = dataclasses.replace(table[1], name="1g.99gb")
    problems = check.compare(catalog.get_model("H100"), [*table[:-1], extra])
    assert "1g.10gb: memory MiB catalog 9984, driver 1" in problems
    assert any(p.startswith("1g.10gb: placements catalog ((0, 1), (1, 1)") for p in problems)
    assert "7g.80gb: in the catalog, not offered by the driver" in problems
    assert "1g.99gb: offered by the driver, missing from the catalog" in problems


def test_report_on_a_fake_driver_only_reads(fake_nvml: FakeNvml) -> None:
    check = load_script()
    with NvmlBackend(Nvml(fake_nvml)) as backend:
        lines, ok = check.catalog_section(backend)
    assert ok, lines
    assert lines.count("Catalog matches the driver.") == 2
    assert not any(
        "Set" in call or "Create" in call or "Destroy" in call for call in fake_nvml.calls
    )


def test_runs_read_only_here(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert "Traceback" not in result.stderr
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:  # no NVIDIA driver here: it says so and exits 4
        assert result.returncode == 4, result.stderr
        assert "Nothing checked: NVIDIA driver not found" in out.read_text()
    else:  # a real GPU: the report has every section (0 or 1 by what it found)
        assert result.returncode in (0, 1), result.stderr
        assert "## MIG catalog against the driver" in out.read_text()
