"""`gpupool exec`: run one command under a share (memory, compute) with no daemon."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from gpupool.cli import options
from gpupool.cli.compute_view import exec_use_lines
from gpupool.core.errors import GpupoolError, InvalidRequest
from gpupool.core.resources import Priority
from gpupool.core.units import (
    MILLI_PER_GPU,
    MemoryShare,
    format_bytes,
    parse_compute_percent,
    parse_int_range,
    parse_memory_share,
)
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    ensure_arbiter,
    node_arbiter_dir,
)
from gpupool.isolation.launch import (
    ComputePolicy,
    LaunchSpec,
    ShareLimits,
    build_launch_spec,
    memory_bytes,
)
from gpupool.isolation.node import LaunchNode, open_launch_node

#: exit statuses of a command that could not be started, as POSIX shells use them
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
#: gpupool exec's own failure, whatever it was, as env(1) and timeout(1) report theirs
EXIT_EXEC_FAILED = 125
#: click's exit status for a usage error
_USAGE_ERROR = 2

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
    # a MIG instance's GPU is found on the node (_on_node); 0 stands in until then
    mig_uuid = gpu.strip() if gpu.strip().startswith("MIG-") else None
    if mig_uuid is not None and "," in mig_uuid:
        raise InvalidRequest("--gpu takes one MIG instance: CUDA shows a process one MIG device")
    gpus = (0,) if mig_uuid is not None else tuple(parse_int_range(gpu, "GPU index"))
    share: MemoryShare | None = parse_memory_share(memory) if memory is not None else None
    milli = parse_compute_percent(compute) if compute is not None else MILLI_PER_GPU
    try:
        chosen = ComputePolicy(policy)
    except ValueError as err:
        raise InvalidRequest(f"invalid compute policy {policy!r}: use cap or share") from err
    try:
        rank = Priority(priority) if priority is not None else None
    except ValueError as err:
        raise InvalidRequest(f"invalid priority {priority!r}: use high or low") from err
    return ShareLimits(gpus, share, milli, chosen, rank, mig_uuid)


def _check_mode(mode: str) -> None:
    """`exec` runs shim shares only: an MPS control daemon must outlive every client of its GPU
    and be the only one there, which is the node daemon's job, not one command's."""
    if mode == "mps":
        raise InvalidRequest(
            "gpupool exec does not run MPS: MPS needs one control daemon per GPU that outlives "
            "its clients; submit to the node daemon instead: gpupool submit --mode mps -- CMD"
        )
    if mode != "shim":
        raise InvalidRequest(f"invalid mode {mode!r} for gpupool exec: use shim")


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


class _ExecCommand(TyperCommand):
    """`exec`'s usage errors (an unknown option) exit 125 too, not click's 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except Exception as err:
            # click's UsageError, which typer vendors without exporting it; it exits with its
            # instance's exit_code
            if getattr(err, "exit_code", None) == _USAGE_ERROR:
                vars(err)["exit_code"] = EXIT_EXEC_FAILED
            raise


@dataclass
class _Seat:
    """The share's place at its arbiter: kept open while the command runs."""

    control: ArbiterControl
    directory: Path
    share: ArbiterShare


def _join_arbiter(node: LaunchNode, limits: ShareLimits) -> _Seat | None:
    """Register the share with the node's arbiter (root's) or this user's own, started if none
    runs; without one the share still holds its cap, alone (said once)."""
    if not limits.arbitrated:
        return None
    directory = node_arbiter_dir(node.sim_node)
    private = os.geteuid() != 0
    try:
        control = ensure_arbiter(directory, private=private)
    except GpupoolError as err:
        typer.echo(f"gpupool: warning: {err}: the share holds its compute cap alone", err=True)
        return None
    share = ArbiterShare.new()
    try:
        control.register(limits.registration(share, os.geteuid(), node.uuids))
    except GpupoolError as err:
        control.close()
        typer.echo(f"gpupool: warning: {err}: the share holds its compute cap alone", err=True)
        return None
    return _Seat(control, directory, share)


def _prepare(
    command: list[str], limits: ShareLimits, simulate: str | None, node_dir: Path | None
) -> tuple[LaunchSpec, LaunchNode, ShareLimits, _Seat | None]:
    """Check every value against the node, announce a simulated one, and build the launch."""
    node = open_launch_node(simulate, node_dir)
    limits, totals = _on_node(node, limits)
    _announce(node, simulate)
    seat = _join_arbiter(node, limits)
    spec = build_launch_spec(
        command,
        limits,
        gpu_totals=totals,
        sim_node=node.sim_node,
        arbiter=(seat.directory, seat.share) if seat is not None else None,
    )
    if limits.memory is not None or limits.compute_milli < MILLI_PER_GPU or limits.priority:
        typer.echo(f"gpupool: {_share_line(node, limits, totals)}", err=True)
    return spec, node, limits, seat


def _report_use(seat: _Seat, node: LaunchNode, limits: ShareLimits, seconds: float) -> None:
    """On stderr, what the share was charged of each GPU against its share (stdout is the
    command's)."""
    if not node.uuids:
        return
    gpus = [(index, limits.mig_uuid or node.uuids[index]) for index in limits.gpus]
    try:
        lines = exec_use_lines(seat.directory, seat.share.share_id, gpus, seconds)
    except GpupoolError as err:
        lines = [f"compute use unknown: {err}"]
    for line in lines:
        typer.echo(f"gpupool: {line}", err=True)


def _on_node(node: LaunchNode, limits: ShareLimits) -> tuple[ShareLimits, list[int | None]]:
    """The share with its GPUs found on the node, and the memory each visible device has: a MIG
    instance's own, since the interception library enforces a share inside the instance."""
    memory = limits.memory if isinstance(limits.memory, MemoryShare) else None
    if limits.mig_uuid is None:
        node.totals_of(limits.gpus)  # an index the node lacks first
        node.check_whole_gpus(limits.gpus)
        node.check_memory_fits(limits.gpus, memory)
        return limits, node.totals_of(limits.gpus)
    device = node.mig_device(limits.mig_uuid)
    if memory is not None and memory.bytes is not None and memory.bytes > device.memory_total:
        raise InvalidRequest(
            f"memory share {format_bytes(memory.bytes)} ({memory.bytes} bytes) is larger than "
            f"MIG instance {device.label} ({format_bytes(device.memory_total)})"
        )
    return dataclasses.replace(limits, gpus=(device.gpu,)), [device.memory_total]


def _share_line(node: LaunchNode, limits: ShareLimits, totals: list[int | None]) -> str:
    """The share as resolved on the node, so that `4G` and `4Gi` are never confused."""
    parts = []
    for index, total in zip(limits.gpus, totals, strict=True):
        memory = "the whole memory"
        if limits.memory is not None:
            size = memory_bytes(limits.memory, total)
            memory = f"{format_bytes(size or 0)} ({size} bytes)"
        where = f"GPU {index} ({node.models[index]})"
        if limits.mig_uuid is not None:
            where = f"MIG instance {node.mig_device(limits.mig_uuid).label} ({node.models[index]})"
        parts.append(f"{where}: memory {memory}")
    percent = limits.compute_milli * 100 // MILLI_PER_GPU
    line = f"{'; '.join(parts)}; compute {percent}% ({limits.policy.value})"
    return line if limits.priority is None else f"{line}, priority {limits.priority.value}"


def register(app: typer.Typer) -> None:
    """Add `exec` to the app."""

    @app.command(
        "exec",
        cls=_ExecCommand,
        context_settings={"allow_interspersed_args": False},
    )
    def exec_(
        command: list[str] = typer.Argument(
            ..., metavar="CMD", help="The command and its arguments, after --."
        ),
        simulate: str | None = options.typer_option(options.SIMULATE),
        node_dir: Path | None = options.typer_option(options.NODE_DIR),
        gpu: str = typer.Option(
            "0", "--gpu", metavar="INDEX", help="GPU index (or 0,1), or a MIG instance's MIG-UUID."
        ),
        memory: str | None = options.typer_option(options.MEMORY),
        compute: str | None = options.typer_option(options.COMPUTE),
        compute_policy: str = typer.Option(
            "cap",
            "--compute-policy",
            metavar="cap|share",
            help="cap: never above the share; share: may use an idle GPU.",
        ),
        priority: str | None = options.typer_option(options.PRIORITY),
        mode: str = typer.Option(
            "shim", "--mode", metavar="shim", help="shim only; MPS jobs go through the daemon."
        ),
    ) -> None:
        """Run one command under a GPU share: gpupool exec --memory 4GiB -- python train.py"""
        # every value is checked before anything runs: syntax first, then against the node
        try:
            _check_mode(mode)
            limits = _limits(gpu, memory, compute, compute_policy, priority)
            spec, node, limits, seat = _prepare(command, limits, simulate, node_dir)
        except GpupoolError as err:
            typer.echo(f"gpupool: error: {err}", err=True)
            raise typer.Exit(EXIT_EXEC_FAILED) from err
        try:
            started = time.monotonic()
            code = _run(spec)
            if seat is not None:
                _report_use(seat, node, limits, time.monotonic() - started)
        finally:
            if seat is not None:
                seat.control.close()  # the share goes with it
            if spec.shared_region is not None:
                shutil.rmtree(spec.shared_region.parent, ignore_errors=True)
        sys.stdout.flush()
        raise typer.Exit(code)
