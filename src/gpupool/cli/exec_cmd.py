"""`gpupool exec`: run one command under a share (memory, compute) with no daemon."""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import typer

from gpupool.core.errors import DeviceError, DriverNotFound, InvalidRequest
from gpupool.core.units import MemoryShare, parse_compute_milli, parse_int_range, parse_memory_share
from gpupool.isolation.launch import ComputePolicy, LaunchSpec, ShareLimits, build_launch_spec
from gpupool.isolation.simnode import default_node_dir, open_or_create_sim_node

#: exit statuses of a command that could not be started, as POSIX shells use them
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _check_nvidia_driver() -> None:
    """One clear line when this machine has no NVIDIA driver: its device node and its library."""
    fix = "install the NVIDIA driver, or run on a simulated node with --simulate 1xH100"
    # /dev/dxg is how the driver appears under WSL
    if not any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/dxg")):
        raise DriverNotFound(f"NVIDIA driver not found (no /dev/nvidiactl): {fix}")
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise DriverNotFound(f"NVIDIA driver not found (cannot load libcuda.so.1): {fix}") from err


def _real_gpu_totals(gpus: tuple[int, ...]) -> list[int | None]:
    """Total memory of each GPU, from NVML (needed to resolve a memory share given in %)."""
    import pynvml

    try:
        pynvml.nvmlInit()
        try:
            return [
                int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                for i in gpus
            ]
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as err:
        raise DeviceError(f"cannot read the GPUs' memory through NVML: {err}") from err


def _run(spec: LaunchSpec) -> int:
    """Run the command, passing termination signals on; its exit status (signal n -> 128+n)."""
    try:
        child = subprocess.Popen(list(spec.argv), env=dict(spec.env))
    except FileNotFoundError:
        typer.echo(f"gpupool: error: command not found: {spec.argv[0]}", err=True)
        return EXIT_NOT_FOUND
    except PermissionError:
        typer.echo(f"gpupool: error: permission denied: {spec.argv[0]}", err=True)
        return EXIT_NOT_EXECUTABLE

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    # Ctrl-C reaches the command through the terminal's process group; we only wait for it
    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED_SIGNALS}
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, previous_int)
    return 128 - status if status < 0 else status


def _limits(
    gpu: str, memory: str | None, compute: str | None, policy: str, gpu_count: int | None
) -> ShareLimits:
    gpus = tuple(parse_int_range(gpu, "GPU index"))
    if gpu_count is not None:
        bad = [g for g in gpus if not 0 <= g < gpu_count]
        if bad:
            last = gpu_count - 1
            raise InvalidRequest(f"invalid GPU index {bad[0]}: this node has GPUs 0..{last}")
    share: MemoryShare | None = parse_memory_share(memory) if memory is not None else None
    milli = parse_compute_milli(compute) if compute is not None else 1000
    try:
        chosen = ComputePolicy(policy)
    except ValueError as err:
        raise InvalidRequest(f"invalid compute policy {policy!r}: use cap or share") from err
    return ShareLimits(gpus, share, milli, chosen)


def register(app: typer.Typer) -> None:
    """Add `exec` to the app."""

    @app.command(
        "exec",
        context_settings={"allow_interspersed_args": False},
    )
    def exec_(
        command: list[str] = typer.Argument(
            ..., metavar="CMD", help="The command and its arguments, after --."
        ),
        simulate: str | None = typer.Option(
            None, "--simulate", metavar="SPEC", help="Run on a simulated node, e.g. 2xH100."
        ),
        gpu: str = typer.Option("0", "--gpu", metavar="INDEX", help="GPU index (or 0,1)."),
        memory: str | None = typer.Option(
            None, "--memory", metavar="SIZE", help="GPU memory per GPU: 4GiB or 50%."
        ),
        compute: str | None = typer.Option(
            None, "--compute", metavar="PERCENT", help="Compute share per GPU, 1..100."
        ),
        compute_policy: str = typer.Option(
            "cap",
            "--compute-policy",
            metavar="cap|share",
            help="cap: never above the share; share: may use an idle GPU.",
        ),
    ) -> None:
        """Run one command under a GPU share: gpupool exec --memory 4GiB -- python train.py"""
        sim_node: Path | None = None
        if simulate is not None:
            node_dir = default_node_dir(simulate)
            state = open_or_create_sim_node(simulate, node_dir)
            try:
                totals_all = [g.memory_total for g in state.gpus()]
                models = ", ".join(g.model for g in state.gpus())
            finally:
                state.close()
            limits = _limits(gpu, memory, compute, compute_policy, len(totals_all))
            totals: list[int | None] = [totals_all[i] for i in limits.gpus]
            sim_node = node_dir
            typer.echo(
                f"gpupool: simulated node {simulate} ({models}) at {node_dir}: no real GPU is used",
                err=True,
            )
        else:
            limits = _limits(gpu, memory, compute, compute_policy, None)
            _check_nvidia_driver()
            needs_totals = isinstance(limits.memory, MemoryShare) and limits.memory.bytes is None
            totals = _real_gpu_totals(limits.gpus) if needs_totals else [None] * len(limits.gpus)
        spec = build_launch_spec(command, limits, gpu_totals=totals, sim_node=sim_node)
        try:
            code = _run(spec)
        finally:
            if spec.shared_region is not None:
                shutil.rmtree(spec.shared_region.parent, ignore_errors=True)
        sys.stdout.flush()
        raise typer.Exit(code)
