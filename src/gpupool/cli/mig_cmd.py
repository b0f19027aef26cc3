"""`gpupool mig ...`: show, check and plan MIG layouts, apply mig-parted configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpupool.cli import options
from gpupool.core.errors import InvalidRequest, MigLayoutError
from gpupool.core.units import format_bytes
from gpupool.devices.factory import open_backend
from gpupool.devices.mig_apply import NodePlan, StepDone, apply_node, driver_tables, plan_node
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot
from gpupool.mig.catalog import MODELS, GpuModel, get_model
from gpupool.mig.catalog_tables import catalog_markdown, model_markdown, nvml_profile_name
from gpupool.mig.partedconfig import load_config
from gpupool.mig.planner import (
    Placement,
    complete_layouts,
    format_layout,
    free_slices,
    parse_layout,
    place_spec,
    room,
)

mig_app = typer.Typer(
    name="mig",
    help="MIG layouts: show them, check them against a model, plan and apply mig-parted configs.",
    no_args_is_help=True,
)

CONFIG_FILE = typer.Option(..., "-f", "--file", metavar="CONFIG.yaml", help="mig-parted config.")
CONFIG_NAME = typer.Option(..., "-c", "--config", metavar="NAME", help="Config name in the file.")
MODEL = typer.Option(..., "--model", "-m", metavar="MODEL", help="GPU model, e.g. H100-80GB.")


def _emit_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _announce(snapshot: NodeSnapshot) -> None:
    """Simulation is never silent: a line on stderr keeps stdout clean for scripts."""
    if snapshot.simulated:
        typer.echo(f"simulated node {snapshot.node_dir} (simulated GPUs)", err=True)


def _placement_json(model: GpuModel, placement: Placement) -> dict[str, Any]:
    profile = model.profile(placement.profile)
    return {
        "profile": profile.name,
        "start": placement.start,
        "size": profile.size,
        "compute_slices": profile.compute_slices,
        "memory": profile.memory_bytes,
    }


def _slices(start: int, size: int) -> str:
    return f"{start}" if size == 1 else f"{start}-{start + size - 1}"


def _placement_line(model: GpuModel, placement: Placement) -> str:
    profile = model.profile(placement.profile)
    return (
        f"  {placement!s:<14} memory slices {_slices(placement.start, profile.size):<4} "
        f"compute {profile.compute_slices}/{model.compute_slices}  "
        f"{format_bytes(profile.memory_bytes)}, {profile.sm_count} SMs"
    )


# --- show ------------------------------------------------------------------------------------


def _known_placements(gpu: GpuSnapshot, model: GpuModel) -> list[Placement] | None:
    if gpu.mig is None:
        return []
    if any(
        i.placement_start is None or not model.has_profile(i.profile) for i in gpu.mig.instances
    ):
        return None  # the driver did not say where (no root): no slice map
    return [Placement(i.placement_start or 0, i.profile) for i in gpu.mig.instances]


def describe_gpu(gpu: GpuSnapshot) -> tuple[dict[str, Any], list[str]]:
    """JSON and text lines for one GPU."""
    data: dict[str, Any] = {"index": gpu.index, "model": gpu.model, "name": gpu.name}
    data["mig"] = gpu.mig.to_json() if gpu.mig is not None else None
    if gpu.mig is None:
        reason = gpu.error or "no MIG on this GPU"
        return data, [f"GPU {gpu.index} ({gpu.model}): {reason}"]
    mode = "on" if gpu.mig.current else "off"
    if gpu.mig.pending != gpu.mig.current:
        mode += f", {'on' if gpu.mig.pending else 'off'} after a GPU reset"
    lines = [f"GPU {gpu.index} ({gpu.model}): MIG {mode}"]
    for inst in sorted(gpu.mig.instances, key=lambda i: (i.placement_start or 0, i.gi_id)):
        where = (
            "?"
            if inst.placement_start is None
            else _slices(inst.placement_start, inst.placement_size)
        )
        lines.append(
            f"  GI {inst.gi_id:<3} CI {inst.ci_id if inst.ci_id is not None else '-':<3} "
            f"{inst.profile:<12} memory slices {where:<4} {format_bytes(inst.memory_total):>9}  "
            f"{inst.uuid or ''}".rstrip()
        )
    try:
        model = get_model(gpu.model)
    except InvalidRequest:
        return data, lines
    placements = _known_placements(gpu, model)
    if gpu.mig.current and placements is not None:
        # the driver's own sizes, not the catalog's: show reports what is there
        used = {
            s
            for i in gpu.mig.instances
            for s in range(i.placement_start or 0, (i.placement_start or 0) + i.placement_size)
        }
        free = [s for s in range(model.memory_slices) if s not in used]
        data["free_slices"] = free
        lines.append(f"  free memory slices: {', '.join(map(str, free)) or 'none'}")
        try:
            more = {name: n for name, n in room(model, placements).items() if n}
        except MigLayoutError:
            return data, lines  # a layout the catalog would not allow: the driver knows better
        data["room"] = more
        if more:
            lines.append("  room for: " + ", ".join(f"{n}x {name}" for name, n in more.items()))
    return data, lines


@mig_app.command("show")
def show(
    simulate: str | None = options.typer_option(options.SIMULATE),
    node_dir: Path | None = options.typer_option(options.NODE_DIR),
    as_json: bool = options.typer_option(options.JSON),
) -> None:
    """The MIG mode, instances, placements and free slices of every GPU."""
    with open_backend(simulate, node_dir) as backend:
        snapshot = backend.snapshot()
    _announce(snapshot)
    shown = [describe_gpu(gpu) for gpu in snapshot.gpus]
    if as_json:
        _emit_json(
            {
                "simulated": snapshot.simulated,
                "driver": snapshot.driver,
                "gpus": [data for data, _ in shown],
            }
        )
        return
    for _, lines in shown:
        typer.echo("\n".join(lines))


# --- check and layouts -------------------------------------------------------------------------


@mig_app.command("check")
def check(
    layout: str = typer.Argument(..., metavar="LAYOUT", help="e.g. 3g.40gb:1,4g.40gb:1"),
    model_name: str = MODEL,
    as_json: bool = options.typer_option(options.JSON),
) -> None:
    """Exit 0 and print the placements when LAYOUT fits MODEL; exit 1 and say why when not."""
    model = get_model(model_name)
    spec = parse_layout(layout)
    try:
        placements = place_spec(model, spec)
    except MigLayoutError as err:
        if as_json:
            _emit_json({"model": model.name, "layout": layout, "fits": False, "reason": str(err)})
            raise typer.Exit(1) from err
        raise
    if as_json:
        _emit_json(
            {
                "model": model.name,
                "layout": layout,
                "fits": True,
                "placements": [_placement_json(model, p) for p in placements],
                "free_slices": free_slices(model, placements),
            }
        )
        return
    typer.echo(f"{layout} fits {model.name}:")
    for placement in placements:
        typer.echo(_placement_line(model, placement))
    free = free_slices(model, placements)
    typer.echo(f"free memory slices: {', '.join(map(str, free)) or 'none'}")


@mig_app.command("layouts")
def layouts(
    model_name: str = MODEL,
    profiles: str | None = typer.Option(
        None, "--profiles", metavar="P1,P2", help="Only these profiles (default: all but +me)."
    ),
    as_json: bool = options.typer_option(options.JSON),
) -> None:
    """Every layout of MODEL to which no further instance can be added."""
    model = get_model(model_name)
    names = [p.strip() for p in profiles.split(",")] if profiles else None
    found = complete_layouts(model, names)
    if as_json:
        _emit_json(
            {
                "model": model.name,
                "layouts": [[_placement_json(model, p) for p in layout] for layout in found],
            }
        )
        return
    typer.echo(f"{len(found)} complete layouts of {model.name}:")
    for layout in found:
        typer.echo(f"  {format_layout(layout)}")


def _profile_json(model: GpuModel) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "nvml_profile": p.nvml_profile,
            "smi_id": p.smi_id,
            "compute_slices": p.compute_slices,
            "memory_slices": p.memory_slices,
            "memory": p.memory_bytes,
            "sm_count": p.sm_count,
            "max_instances": p.max_instances,
            "starts": list(p.starts),
        }
        for p in model.profiles
    ]


def _catalog_lines(model: GpuModel) -> list[str]:
    note = "" if model.exact else " (nominal memory sizes)"
    lines = [f"{model.name}: {model.marketing_name}, {format_bytes(model.memory_bytes)}{note}"]
    lines.append(
        f"  {'profile':<12} {'NVML profile':<13} {'smi id':>6} {'compute':>7} {'memory':>6} "
        f"{'size':>9} {'SMs':>4} {'max':>3}  starts"
    )
    for p in model.profiles:
        lines.append(
            f"  {p.name:<12} {nvml_profile_name(p.nvml_profile):<13} {p.smi_id:>6} "
            f"{p.compute_slices:>7} {p.memory_slices:>6} {format_bytes(p.memory_bytes):>9} "
            f"{p.sm_count:>4} {p.max_instances:>3}  {','.join(map(str, p.starts))}"
        )
    return lines


@mig_app.command("catalog")
def catalog_command(
    model_name: str | None = typer.Option(
        None, "--model", "-m", metavar="MODEL", help="One model (default: all)."
    ),
    markdown: bool = typer.Option(False, "--markdown", help="Markdown tables (docs/mig.md)."),
    as_json: bool = options.typer_option(options.JSON),
) -> None:
    """The MIG profiles gpupool knows: sizes, NVML ids, valid starts, per model."""
    models = [get_model(model_name)] if model_name else list(MODELS)
    if markdown:
        typer.echo(model_markdown(models[0]) if model_name else catalog_markdown())
    elif as_json:
        _emit_json([{"model": m.name, "profiles": _profile_json(m)} for m in models])
    else:
        typer.echo("\n".join(line for m in models for line in [*_catalog_lines(m), ""]).rstrip())


# --- plan and apply ----------------------------------------------------------------------------


def _plan_json(plan: NodePlan) -> dict[str, Any]:
    gpus = []
    for gpu in plan.gpus:
        model = get_model(gpu.model)
        gpus.append(
            {
                "index": gpu.index,
                "model": gpu.model,
                "mig_enabled": gpu.plan.mig_enabled,
                "steps": [str(step) for step in gpu.plan.steps],
                "final": [_placement_json(model, p) for p in gpu.plan.final],
                "kept": [_placement_json(model, p) for p in gpu.plan.kept],
                "blocking_pids": list(gpu.blocking_pids),
                "config_line": gpu.target.line,
            }
        )
    return {
        "config": plan.config,
        "simulated": plan.simulated,
        "gpus": gpus,
        "untouched": list(plan.untouched),
    }


def _plan_lines(plan: NodePlan) -> list[str]:
    lines = []
    for gpu in plan.gpus:
        model = get_model(gpu.model)
        steps = len(gpu.plan.steps)
        head = f"GPU {gpu.index} ({gpu.model}): "
        head += f"{steps} step{'s' if steps != 1 else ''}" if steps else "already as configured"
        lines.append(head)
        lines += [f"  {number}. {step}" for number, step in enumerate(gpu.plan.steps, start=1)]
        if not gpu.plan.mig_enabled:
            lines.append("  final: MIG off")
        else:
            lines.append("  final:" if gpu.plan.final else "  final: MIG on, no instances")
            lines += [_placement_line(model, p) for p in gpu.plan.final]
    for index in plan.untouched:
        lines.append(f"GPU {index}: no entry of config {plan.config!r} matches; left as it is")
    return lines


def _blocked_reason(plan: NodePlan, force: bool) -> str | None:
    blocked = plan.blocked(force)
    if not blocked:
        return None
    detail = "; ".join(
        f"GPU {g.index} runs {', '.join(map(str, g.blocking_pids))}" for g in blocked
    )
    return f"apply would stop running processes ({detail}): stop them or use --force"


@mig_app.command("plan")
def plan(
    config_file: Path = CONFIG_FILE,
    config_name: str = CONFIG_NAME,
    simulate: str | None = options.typer_option(options.SIMULATE),
    node_dir: Path | None = options.typer_option(options.NODE_DIR),
    force: bool = typer.Option(False, "--force", help="Plan as `apply --force` would."),
    as_json: bool = options.typer_option(options.JSON),
) -> None:
    """Dry run: per GPU the steps and the final layout; exit 1 when it cannot be applied."""
    config = load_config(config_file)
    with open_backend(simulate, node_dir) as backend:
        snapshot = backend.snapshot()
        tables = driver_tables(backend, snapshot)
    _announce(snapshot)
    node_plan = plan_node(snapshot, config, config_name, tables)
    if as_json:
        _emit_json(_plan_json(node_plan))
    else:
        typer.echo("\n".join(_plan_lines(node_plan)))
    reason = _blocked_reason(node_plan, force)
    if reason is not None:
        typer.echo(f"gpupool: {reason}", err=True)
        raise typer.Exit(1)


@mig_app.command("apply")
def apply(
    config_file: Path = CONFIG_FILE,
    config_name: str = CONFIG_NAME,
    simulate: str | None = options.typer_option(options.SIMULATE),
    node_dir: Path | None = options.typer_option(options.NODE_DIR),
    force: bool = typer.Option(
        False, "--force", help="Go ahead on GPUs with running processes (they will be stopped)."
    ),
) -> None:
    """Apply a mig-parted config: each run plans from the state now, so a rerun finishes."""
    config = load_config(config_file)

    def progress(done: StepDone) -> None:
        typer.echo(f"GPU {done.index}: {done.step}")

    with open_backend(simulate, node_dir) as backend:
        if backend.simulated:
            typer.echo("applying to simulated GPUs", err=True)
        node_plan = apply_node(backend, config, config_name, force=force, progress=progress)
    if not node_plan.changes:
        typer.echo(f"nothing to do: the GPUs already match config {config_name!r}")
        return
    for gpu in node_plan.gpus:
        final = format_layout(gpu.plan.final) if gpu.plan.mig_enabled else "MIG off"
        typer.echo(f"GPU {gpu.index} ({gpu.model}): {final}")


def register(app: typer.Typer) -> None:
    """Add the `mig` command group to the app."""
    app.add_typer(mig_app, name="mig")
