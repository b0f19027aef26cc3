"""Every GPU check of bench/gpu/ in one command, fitted to about 8 minutes on one H100 or H200.

    python3 bench/gpu/campaign.py OUTDIR            # on the GPU (bench/gpu/campaign.sh OUTDIR)
    python3 bench/gpu/campaign.py OUTDIR --dry-run  # the same scripts on simulated GPUs

Each check runs as its own process group with its own time budget: one that hangs is killed at
its budget, and the others still run. Each writes its table to OUTDIR/NAME.md and its output to
OUTDIR/NAME.log; OUTDIR/summary.md has one row per check (passed, failed, timed out, nothing
checked) and, on a GPU, the GPU's settings read before and after, which must be the same.

It only reads the GPU's settings (nvidia-smi --query-gpu): neither it nor any check changes the
MIG mode, compute mode, clocks or power limit, or resets the GPU. On a bare machine with python3
and this repository only, it first makes .venv (pip install -e ., which builds native/), and on
a GPU adds PyTorch and transformers, within the setup's own budget. It needs only the standard
library itself, so the system's python3 runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "bench" / "gpu"
#: a check's exit status that says nothing could be checked (no driver, no nvcc)
NOTHING_CHECKED = 4
#: what the GPU checks import beyond gpupool's own dependencies
GPU_PACKAGES = ("torch", "transformers")
#: read before and after the checks: none of them may change
SETTINGS = (
    "name,driver_version,mig.mode.current,compute_mode,power.limit,"
    "clocks.applications.graphics,clocks.applications.memory"
)
SETUP_BUDGET_S = 120.0


@dataclass(frozen=True)
class Check:
    """One script of bench/gpu/: its arguments on the GPU and in the dry run (None: it has no
    simulated twin), and the seconds it may take."""

    name: str
    script: str
    gpu_args: tuple[str, ...]
    sim_args: tuple[str, ...] | None
    budget_s: float


#: in the order they run: the read-only device check first, the longest last. Budgets are
#: ceilings (a check on an H100 takes about two thirds of its own); together with the setup they
#: come to 8 minutes.
CHECKS = (
    Check("devices", "devices_check.py", (), (), 30),
    Check("daemon", "daemon.py", ("--jobs", "4", "--hold", "4"), ("--simulate", "1xA30"), 30),
    Check("watchdog", "watchdog.py", (), ("--simulate", "1xA30"), 25),
    Check("elastic", "elastic.py", ("--gib", "4"), ("--simulate", "1xA100-40GB"), 35),
    Check(
        "isolation",
        "isolation.py",
        ("--seconds", "1.5", "--launches", "50000", "--repeat", "2"),
        None,
        40,
    ),
    Check(
        "compute-together",
        "compute_together.py",
        ("--only", "together", "--seconds", "2"),
        ("--simulate", "--only", "together", "--seconds", "1"),
        45,
    ),
    Check(
        "compute-priority",
        "compute_together.py",
        ("--only", "priority", "--seconds", "2"),
        ("--simulate", "--only", "priority", "--seconds", "1"),
        25,
    ),
    Check(
        "compute-paths",
        "compute_together.py",
        ("--only", "paths", "--seconds", "2", "--long-seconds", "4"),
        ("--simulate", "--only", "paths", "--seconds", "1", "--long-seconds", "2"),
        40,
    ),
    Check(
        "modes",
        "modes.py",
        ("--seconds", "4", "--memory-gib", "4"),
        ("--simulate", "1xA30", "--seconds", "1", "--memory-gib", "2"),
        45,
    ),
    Check(
        "inference",
        "inference_pool.py",
        ("--seconds", "8"),
        ("--simulate", "--seconds", "1"),
        45,
    ),
)


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str
    code: int | None
    seconds: float
    budget_s: float


def run_check(check: Check, python: str, out: Path, dry_run: bool, budget_s: float) -> Outcome:
    """`check` in a process group of its own, stopped at its budget with all it started."""
    args = check.sim_args if dry_run else check.gpu_args
    if args is None:
        note = "not run: no simulated twin (it needs PyTorch on a GPU)"
        (out / f"{check.name}.log").write_text(note + "\n")
        return Outcome(check.name, note, None, 0.0, budget_s)
    command = [python, str(HERE / check.script), *args, "--out", str(out / f"{check.name}.md")]
    started = time.monotonic()
    with open(out / f"{check.name}.log", "w") as log:
        log.write("$ " + " ".join(command[1:]) + "\n")
        log.flush()
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=check_env(), start_new_session=True
        )
        try:
            code: int | None = child.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _stop_group(child)
    seconds = time.monotonic() - started
    return Outcome(check.name, _status(code, budget_s), code, seconds, budget_s)


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    """A check past its budget gets SIGINT first, so that its own cleanup stops the daemon it
    started; then whatever is left in its process group is killed, and so is whatever it left
    in sessions of their own (a job's supervisor, the job, the arbiter), which this process,
    a subreaper, inherited."""
    if child.poll() is None:
        _signal_group(child.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=15)
    _signal_group(child.pid, signal.SIGKILL)
    child.wait()
    for _ in range(20):  # each pass kills one level: a killed supervisor's job comes next
        orphans = _children()
        if not orphans:
            return
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _children() -> list[int]:
    """This process's living children, from /proc."""
    me = os.getpid()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # the parent's pid is the second field after the command's closing parenthesis
            if int(stat.read_text().rpartition(")")[2].split()[1]) == me:
                found.append(int(stat.parent.name))
    return found


def become_subreaper() -> None:
    """Adopt what a check leaves in sessions of its own, to stop it after the check."""
    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing left in it
        os.killpg(group, sig)


def _status(code: int | None, budget_s: float) -> str:
    if code is None:
        return f"timed out after {budget_s:g} s (killed)"
    if code == 0:
        return "passed"
    if code == NOTHING_CHECKED:
        return "nothing checked (no NVIDIA driver, or no nvcc)"
    return "failed"


def check_env() -> dict[str, str]:
    """As from a checkout: none of the caller's GPUPOOL_* settings, this tree's src/ first, and
    temporary files under /tmp (a daemon's socket path must stay short)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = str(REPO / "src")
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = "/tmp"
    return env


def gpu_settings() -> str:
    """The GPUs' settings that no check may change, one CSV line per GPU (read-only)."""
    query = ["nvidia-smi", f"--query-gpu={SETTINGS}", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unreadable: {err}"
    return done.stdout.strip() if done.returncode == 0 else f"unreadable: {done.stderr.strip()}"


def setup(python: Path, dry_run: bool, out: Path, budget_s: float) -> Outcome:
    """.venv with gpupool installed editable (native/ built by it), and on a GPU the packages
    the checks import; each step only where what it gives is missing."""
    steps = []
    if not python.exists():
        steps.append([sys.executable, "-m", "venv", str(REPO / ".venv")])
    if not _imports(python, ("gpupool", "fastapi")):
        steps.append([str(python), "-m", "pip", "install", "-q", "-e", str(REPO)])
    if not dry_run and not _imports(python, GPU_PACKAGES):
        steps.append([str(python), "-m", "pip", "install", "-q", *GPU_PACKAGES])
    started = time.monotonic()
    code: int | None = 0
    with open(out / "setup.log", "w") as log:
        for step in steps:
            left = budget_s - (time.monotonic() - started)
            log.write("$ " + " ".join(step) + "\n")
            log.flush()
            try:
                code = subprocess.run(
                    step, stdout=log, stderr=subprocess.STDOUT, timeout=left
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                break
    status = "nothing to install" if not steps else _status(code, budget_s)
    return Outcome("setup", status, code, time.monotonic() - started, budget_s)


def _imports(python: Path, modules: tuple[str, ...]) -> bool:
    if not python.exists():
        return False
    probe = [str(python), "-c", "import " + ", ".join(modules)]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def summary(outcomes: list[Outcome], out: Path, settings: tuple[str, str] | None) -> str:
    """The summary's markdown: a row per check (its table, else its log), and the GPUs'
    settings before and after the checks."""
    mode = " --dry-run" if settings is None else ""
    lines = [f"# GPU checks: `bench/gpu/campaign.sh OUTDIR{mode}`", ""]
    lines += [
        "| check | status | exit | seconds | budget s | output |",
        "|---|---|---:|---:|---:|---|",
    ]
    for o in outcomes:
        found = [f"{o.name}{s}" for s in (".md", ".log") if (out / f"{o.name}{s}").exists()]
        written = found[0] if found else ""
        code = "" if o.code is None else str(o.code)
        lines.append(
            f"| {o.name} | {o.status} | {code} | {o.seconds:.0f} | {o.budget_s:g} | {written} |"
        )
    lines.append("")
    if settings is not None:
        before, after = settings
        lines += [f"GPU settings ({SETTINGS}):", "", f"- before: `{before}`"]
        lines += [f"- after: `{after}`", f"- unchanged: {'yes' if before == after else 'NO'}", ""]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    names = [c.name for c in CHECKS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path, help="where the tables and the summary go")
    parser.add_argument("--dry-run", action="store_true", help="on simulated GPUs, no GPU")
    parser.add_argument("--only", help="checks to run, comma-separated: " + ",".join(names))
    parser.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="another budget for one check (repeatable)",
    )
    parser.add_argument(
        "--python", help="run the checks with this interpreter, which has gpupool (no setup)"
    )
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else names
    unknown = [n for n in chosen if n not in names]
    budgets = dict(item.partition("=")[::2] for item in args.budget)
    unknown += [n for n in budgets if n not in names]
    if unknown:
        parser.error(f"no check named {', '.join(unknown)} (the checks: {', '.join(names)})")
    try:
        args.budgets = {name: float(value) for name, value in budgets.items()}
    except ValueError:
        parser.error(f"--budget takes NAME=SECONDS, not {' '.join(args.budget)}")
    args.checks = [c for c in CHECKS if c.name in chosen]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out: Path = args.outdir
    out.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    outcomes = []
    if args.python:
        python = args.python
    else:
        venv_python = REPO / ".venv" / "bin" / "python"
        outcomes.append(setup(venv_python, args.dry_run, out, SETUP_BUDGET_S))
        python = str(venv_python)
    before = None if args.dry_run else gpu_settings()
    for check in args.checks:
        budget_s = args.budgets.get(check.name, check.budget_s)
        outcomes.append(run_check(check, python, out, args.dry_run, budget_s))
        print(f"{check.name}: {outcomes[-1].status}", flush=True)
    settings = None if before is None else (before, gpu_settings())
    text = summary(outcomes, out, settings)
    (out / "summary.md").write_text(text)
    print(text)
    failed = [o for o in outcomes if o.status == "failed" or o.status.startswith("timed out")]
    return 1 if failed or (settings is not None and settings[0] != settings[1]) else 0


if __name__ == "__main__":
    sys.exit(main())
