"""`gpupool exec`: run one command under a share (memory, compute) with no daemon."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import typer

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MemoryShare, parse_compute_milli, parse_int_range, parse_memory_share
from gpupool.isolation.launch import (
    ComputePolicy,
    LaunchSpec,
    Priority,
    ShareLimits,
    build_launch_spec,
)
from gpupool.isolation.node import LaunchNode, open_launch_node

#: exit statuses of a command that could not be started, as POSIX shells use them
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


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
    gpu: str, memory: str | None, compute: str | None, policy: str, priority: str | None
) -> ShareLimits:
    gpus = tuple(parse_int_range(gpu, "GPU index"))
    share: MemoryShare | None = parse_memory_share(memory) if memory is not None else None
    milli = parse_compute_milli(compute) if compute is not None else 1000
    try:
        chosen = ComputePolicy(policy)
    except ValueError as err:
        raise InvalidRequest(f"invalid compute policy {policy!r}: use cap or share") from err
    try:
        rank = Priority(priority) if priority is not None else None
    except ValueError as err:
        raise InvalidRequest(f"invalid priority {priority!r}: use high or low") from err
    return ShareLimits(gpus, share, milli, chosen, rank)


def _announce(node: LaunchNode, simulate: str | None) -> None:
    """A simulated node is never silent: say which one, on stderr (stdout is the command's)."""
    if node.sim_node is None:
        return
    spec = simulate if simulate is not None else node.sim_spec
    models = ", ".join(node.models)
    typer.echo(
        f"gpupool: simulated node {spec} ({models}) at {node.sim_node}: no real GPU is used",
        err=True,
    )


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
        node_dir: Path | None = typer.Option(
            None, "--node-dir", metavar="DIR", help="The simulated node's directory."
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
        priority: str | None = typer.Option(
            None,
            "--priority",
            metavar="high|low",
            help="high: guaranteed; low: only while no high share on the GPU has work.",
        ),
    ) -> None:
        """Run one command under a GPU share: gpupool exec --memory 4GiB -- python train.py"""
        # every value is checked before anything runs: syntax first, then against the node
        limits = _limits(gpu, memory, compute, compute_policy, priority)
        node = open_launch_node(simulate, node_dir)
        totals = node.totals_of(limits.gpus)
        _announce(node, simulate)
        spec = build_launch_spec(command, limits, gpu_totals=totals, sim_node=node.sim_node)
        try:
            code = _run(spec)
        finally:
            if spec.shared_region is not None:
                shutil.rmtree(spec.shared_region.parent, ignore_errors=True)
        sys.stdout.flush()
        raise typer.Exit(code)
