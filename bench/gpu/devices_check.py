"""Read-only check of gpupool's device layer on a real NVIDIA GPU.

Runs `gpupool gpus --json` and `gpupool mig show`, and compares gpupool's MIG catalog with the
profile table the driver reports for each GPU's model. It only reads: it never changes the MIG
mode, compute mode, clocks, power limits or any other setting.

    python bench/gpu/devices_check.py --out docs/benchmarks/gpu-checks-devices.md

Exit status: 0 when everything matches, 1 when the catalog and the driver disagree or a command
failed, 4 when there is no NVIDIA driver (nothing could be checked).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from pathlib import Path

from gpupool.core.errors import DriverNotFound, GpupoolError
from gpupool.devices.backend import DriverProfile
from gpupool.devices.nvml import NvmlBackend
from gpupool.mig import catalog

COMMANDS = (["gpus", "--json"], ["mig", "show"])


def run_gpupool(args: list[str]) -> tuple[int, str]:
    """`gpupool ARGS` with this interpreter: exit code and combined output."""
    command = [sys.executable, "-m", "gpupool", *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    return result.returncode, (result.stdout + result.stderr).rstrip()


def compare(model: catalog.GpuModel, driver: list[DriverProfile]) -> list[str]:
    """Differences between the catalog's profiles for `model` and the driver's table."""
    by_name = {p.name: p for p in driver}
    problems = []
    for profile in model.profiles:
        seen = by_name.pop(profile.name, None)
        if seen is None:
            problems.append(f"{profile.name}: in the catalog, not offered by the driver")
            continue
        expected = {
            "profile id": (profile.smi_id, seen.profile_id),
            "compute slices": (profile.compute_slices, seen.slice_count),
            "memory MiB": (profile.memory_mib, seen.memory_mib),
            "SM count": (profile.sm_count, seen.sm_count),
            "max instances": (profile.max_instances, seen.instance_count),
            "placements": (
                tuple((start, profile.size) for start in profile.starts),
                seen.placements,
            ),
        }
        for what, (ours, theirs) in expected.items():
            if ours != theirs:
                note = " (catalog figure is nominal)" if not model.exact else ""
                problems.append(f"{profile.name}: {what} catalog {ours}, driver {theirs}{note}")
    problems.extend(f"{name}: offered by the driver, missing from the catalog" for name in by_name)
    return problems


def catalog_section(backend: NvmlBackend) -> tuple[list[str], bool]:
    """Report lines comparing catalog and driver for every GPU; True when all match."""
    lines, ok = [], True
    for gpu in backend.snapshot().gpus:
        lines.append(f"### GPU {gpu.index}: {gpu.name} ({gpu.model})")
        try:
            model = catalog.get_model(gpu.model)
        except GpupoolError:
            lines.append("Not a catalog model: nothing to compare.")
            continue
        table = backend.mig_profile_table(gpu.index)
        if not table:
            mode = "off" if gpu.mig is None or not gpu.mig.current else "on"
            lines.append(
                f"The driver gives no MIG profile table (MIG mode {mode}); this check does not "
                "change the MIG mode, so nothing was compared."
            )
            continue
        lines.append("| profile | id | slices | memory MiB | SMs | max | placements |")
        lines.append("|---|---|---|---|---|---|---|")
        for p in table:
            starts = ",".join(f"{s}:{n}" for s, n in p.placements)
            lines.append(
                f"| {p.name} | {p.profile_id} | {p.slice_count} | {p.memory_mib} | "
                f"{p.sm_count} | {p.instance_count} | {starts} |"
            )
        problems = compare(model, table)
        ok = ok and not problems
        lines.append("")
        lines.extend([f"- MISMATCH {p}" for p in problems] or ["Catalog matches the driver."])
    return lines, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the report (markdown) to this file")
    args = parser.parse_args()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report = ["# gpupool device check", "", f"Run {stamp}: `python bench/gpu/devices_check.py`", ""]
    status = 0
    try:
        backend = NvmlBackend()
    except DriverNotFound as err:
        report.append(f"Nothing checked: {err}")
        status = 4
    else:
        with backend:
            for command in COMMANDS:
                code, output = run_gpupool(command)
                status = status or (1 if code else 0)
                report += [f"## gpupool {' '.join(command)} (exit {code})", "", "```", output]
                report += ["```", ""]
            report += ["## MIG catalog against the driver", ""]
            lines, ok = catalog_section(backend)
            report += lines
            status = status or (0 if ok else 1)
    text = "\n".join(report) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
