"""bench/gpu/campaign.sh: every GPU check in one command, each within its budget, a table each
and a summary; its dry run on simulated GPUs, so the campaign is never run blind on a GPU."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "bench" / "gpu"


def load_campaign() -> ModuleType:
    spec = importlib.util.spec_from_file_location("campaign", GPU / "campaign.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def campaign(out: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The campaign's dry run from the shell script, as from a checkout (no GPUPOOL_* settings),
    with the interpreter of these tests (it has gpupool)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    command = [str(GPU / "campaign.sh"), str(out), "--dry-run", "--python", sys.executable, *args]
    return subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)


def rows(summary: str) -> dict[str, list[str]]:
    cells = [line.strip("|").split(" | ") for line in summary.splitlines() if line.startswith("| ")]
    return {row[0].strip(): [c.strip() for c in row[1:]] for row in cells[1:]}


def test_every_gpu_check_is_in_the_campaign() -> None:
    scripts = {
        path.name
        for path in GPU.glob("*.py")
        if '__name__ == "__main__"' in path.read_text() and path.name != "campaign.py"
    }
    assert scripts == {check.script for check in load_campaign().CHECKS}


def test_the_budgets_and_the_setup_fit_in_eight_minutes() -> None:
    module = load_campaign()
    assert module.SETUP_BUDGET_S + sum(c.budget_s for c in module.CHECKS) <= 8 * 60


def test_the_dry_run_writes_a_table_per_check_and_a_summary(tmp_path: Path) -> None:
    done = campaign(tmp_path, "--only", "devices,daemon,watchdog,isolation")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (tmp_path / "summary.md").read_text()
    found = rows(summary)
    assert list(found) == ["devices", "daemon", "watchdog", "isolation"], summary
    assert found["daemon"][0] == found["watchdog"][0] == "passed", summary
    assert found["isolation"][0].startswith("not run: no simulated twin"), summary
    # no NVIDIA driver here: the read-only device check says so (4), which fails nothing
    assert found["devices"][:2] == ["nothing checked (no NVIDIA driver, or no nvcc)", "4"]
    for name in ("daemon", "watchdog"):
        assert "| yes |" in (tmp_path / f"{name}.md").read_text()
        assert (tmp_path / f"{name}.log").read_text().startswith(f"$ {GPU / found_script(name)}")


def found_script(name: str) -> str:
    return next(c.script for c in load_campaign().CHECKS if c.name == name)


def test_a_check_past_its_budget_is_stopped_and_the_rest_still_run(tmp_path: Path) -> None:
    done = campaign(tmp_path, "--only", "daemon,watchdog", "--budget", "daemon=6")
    assert done.returncode == 1, done.stdout + done.stderr
    found = rows((tmp_path / "summary.md").read_text())
    assert found["daemon"][0] == "timed out after 6 s (killed)"
    assert found["watchdog"][0] == "passed"
    # the stopped check's daemon (state in gpupool-gpu-daemon-*) went with it
    serving = subprocess.run(
        ["pgrep", "-af", "gpupool-gpu-daemon-"], capture_output=True, text=True
    )
    assert sys.executable not in serving.stdout, serving.stdout


def test_a_check_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    done = campaign(tmp_path, "--only", "daemon,nope", timeout=30)
    assert done.returncode == 2
    assert "no check named nope" in done.stderr and "Traceback" not in done.stderr


#: what a GPU check may ask nvidia-smi: queries only
READ_ONLY_OPTIONS = {"--query-gpu", "--query-compute-apps", "--format", "-i", "--id", "-L", "-q"}
#: gpupool's own and NVML's calls that change a GPU
SETTERS = re.compile(r"nvmlDevice(Set|Reset)\w*|\bset_mig_mode\b|\bapply_node\b|mig apply")


def options(call: str) -> set[str]:
    """The options of a command line, as a shell line or a Python list writes them."""
    return {o.partition("=")[0] for o in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", call)}


def test_no_gpu_check_changes_the_gpus_settings() -> None:
    """Neither the campaign nor a GPU check asks nvidia-smi for anything but a query, or calls
    what sets MIG mode, compute mode, clocks, power limit or persistence, or resets a GPU."""
    for path in sorted(GPU.iterdir()):
        if path.suffix not in (".py", ".sh"):
            continue
        text = path.read_text()
        assert not SETTERS.search(text), (path.name, SETTERS.search(text))
        # each call: from `nvidia-smi` to the end of its argument list or of its line
        for call in re.findall(r"nvidia-smi[^\]\n]*", text):
            assert options(call) <= READ_ONLY_OPTIONS, (path.name, call)


def test_the_read_only_guard_finds_a_setting_changed() -> None:
    call = 'subprocess.run(["nvidia-smi", "-i", "0", "-pl", "300"])'
    assert not options(call) <= READ_ONLY_OPTIONS
    assert SETTERS.search("backend.set_mig_mode(0, True)")
