"""Apply a mig-parted config to a node: plan per GPU from a snapshot, then act step by step.

Each run plans from the state the backend reports now, so a run that stopped half-way (a
driver error, a crash) is finished by running it again: instances that already match stay.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.errors import (
    DeviceError,
    GpupoolError,
    InvalidRequest,
    MigLayoutError,
    NotAvailable,
)
from gpupool.devices.backend import DriverProfile, GpuBackend
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot
from gpupool.mig.catalog import GpuModel, get_model, with_driver_table
from gpupool.mig.partedconfig import GpuIdentity, GpuTarget, PartedConfig, targets
from gpupool.mig.planner import ExistingInstance, GpuPlan, Step, plan_gpu


@dataclass(frozen=True)
class GpuApplyPlan:
    """What a config asks of one GPU, the steps to get there, and what stands in the way."""

    index: int
    model: str
    target: GpuTarget
    plan: GpuPlan
    #: pids on the GPU that a destroy or a mode change would disturb
    blocking_pids: tuple[int, ...]

    @property
    def disturbs_processes(self) -> bool:
        return bool(self.blocking_pids)


@dataclass(frozen=True)
class NodePlan:
    """A config's plan for every GPU of a node; `untouched` are GPUs no entry matches."""

    config: str
    simulated: bool
    gpus: tuple[GpuApplyPlan, ...]
    untouched: tuple[int, ...]

    @property
    def changes(self) -> bool:
        return any(g.plan.changes for g in self.gpus)

    def blocked(self, force: bool) -> list[GpuApplyPlan]:
        """GPUs whose plan would disturb running processes (none when `force`)."""
        return [] if force else [g for g in self.gpus if g.disturbs_processes]


def _catalog_model(gpu: GpuSnapshot) -> GpuModel | None:
    try:
        return get_model(gpu.model) if gpu.model else None
    except InvalidRequest:
        return None


def _existing(gpu: GpuSnapshot) -> tuple[bool, list[ExistingInstance]]:
    if gpu.mig is None:
        return False, []
    instances = [ExistingInstance(i.gi_id, i.profile, i.placement_start) for i in gpu.mig.instances]
    return gpu.mig.current, instances


def _disturbing(plan: GpuPlan) -> bool:
    """Destroying an instance or switching MIG mode stops what runs; creating one does not."""
    return any(step.action != "create" for step in plan.steps)


DriverTables = Mapping[int, Sequence[DriverProfile]]


def _planning_model(target: GpuTarget, tables: DriverTables) -> GpuModel:
    """The catalog's model, or the driver's own table of it where one was read."""
    model = with_driver_table(target.model, tables.get(target.index, ()))
    for profile in target.counts:
        if not model.has_profile(profile):
            raise MigLayoutError(
                f"GPU {target.index} ({model.name}): its driver does not offer {profile}; "
                f"it offers {', '.join(model.profile_names)}"
            )
    return model


def plan_node(
    snapshot: NodeSnapshot, config: PartedConfig, name: str, tables: DriverTables | None = None
) -> NodePlan:
    """Plan config `name` for every GPU of `snapshot` (nothing is changed).

    `tables` holds the driver's profile tables by GPU index; where given, planning uses them
    instead of the catalog.
    """
    by_index = {gpu.index: gpu for gpu in snapshot.gpus}
    identities = [GpuIdentity(g.index, _catalog_model(g)) for g in snapshot.gpus]
    planned = []
    for target in targets(config, name, identities):
        gpu = by_index[target.index]
        if not gpu.healthy:
            raise DeviceError(f"GPU {gpu.index} cannot be configured: {gpu.error or 'unhealthy'}")
        if gpu.mig is None:
            raise DeviceError(f"GPU {gpu.index} ({gpu.model}) does not report a MIG mode")
        enabled_now, existing = _existing(gpu)
        model = _planning_model(target, tables or {})
        plan = plan_gpu(model, enabled_now, existing, target.mig_enabled, target.counts)
        pids = tuple(p.pid for p in gpu.processes) if _disturbing(plan) else ()
        planned.append(GpuApplyPlan(gpu.index, target.model.name, target, plan, pids))
    planned.sort(key=lambda g: g.index)
    done = {g.index for g in planned}
    untouched = tuple(g.index for g in snapshot.gpus if g.index not in done)
    return NodePlan(name, snapshot.simulated, tuple(planned), untouched)


def driver_tables(backend: GpuBackend, snapshot: NodeSnapshot) -> dict[int, list[DriverProfile]]:
    """The driver's profile tables of a real node's MIG GPUs; none for a simulated node.

    A simulated node's table is the catalog itself, so there is nothing to read.
    """
    if backend.simulated:
        return {}
    tables = {}
    for gpu in snapshot.gpus:
        if gpu.healthy and gpu.mig is not None:
            try:
                tables[gpu.index] = backend.mig_profile_table(gpu.index)
            except NotAvailable:
                continue  # no table (MIG off on some drivers): the catalog stands in
    return tables


def plan_backend(backend: GpuBackend, config: PartedConfig, name: str) -> NodePlan:
    """Plan config `name` on the node behind `backend` as it is now."""
    snapshot = backend.snapshot()
    return plan_node(snapshot, config, name, driver_tables(backend, snapshot))


@dataclass(frozen=True)
class StepDone:
    """One step carried out on one GPU."""

    index: int
    step: Step


Progress = Callable[[StepDone], None]


def _refuse(plan: NodePlan, backend: GpuBackend, force: bool) -> None:
    blocked = plan.blocked(force)
    if blocked:
        detail = "; ".join(
            f"GPU {g.index} runs {', '.join(map(str, g.blocking_pids))}" for g in blocked
        )
        raise DeviceError(
            f"refusing to change MIG on GPUs with running processes ({detail}): stop them "
            "or use --force"
        )
    if plan.changes and not backend.simulated and os.geteuid() != 0:
        raise DeviceError(
            "changing MIG mode or instances on real GPUs needs root: run it again with sudo"
        )


def apply_node(
    backend: GpuBackend,
    config: PartedConfig,
    name: str,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> NodePlan:
    """Plan from the backend's state now, then carry out the steps GPU by GPU.

    Nothing is changed unless every GPU's plan is possible and allowed. A step that fails stops
    the run with a DeviceError that says how far it got; the state stays as the driver left it
    (`mig show` reports it), and running the same apply again finishes the job.
    """
    plan = plan_backend(backend, config, name)
    _refuse(plan, backend, force)
    for gpu in plan.gpus:
        _apply_gpu(backend, gpu, force, progress)
    return plan


def _apply_gpu(
    backend: GpuBackend, gpu: GpuApplyPlan, force: bool, progress: Progress | None
) -> None:
    total = len(gpu.plan.steps)
    for number, step in enumerate(gpu.plan.steps, start=1):
        try:
            _run_step(backend, gpu.index, step, force)
        except GpupoolError as err:
            raise DeviceError(
                f"GPU {gpu.index}: step {number} of {total} ({step}) failed: {err}; "
                f"{number - 1} done. `gpupool mig show` shows the state now; "
                "run the same `gpupool mig apply` again to finish"
            ) from err
        if progress is not None:
            progress(StepDone(gpu.index, step))


def _run_step(backend: GpuBackend, index: int, step: Step, force: bool) -> None:
    if step.action in ("enable", "disable"):
        enable = step.action == "enable"
        backend.set_mig_mode(index, enable, force=force)
        _require_mode(backend, index, enable)
    elif step.action == "destroy":
        assert step.gi_id is not None
        backend.destroy_gpu_instance(index, step.gi_id)
    else:
        assert step.profile is not None and step.start is not None
        backend.create_gpu_instance(index, step.profile, step.start)


def _require_mode(backend: GpuBackend, index: int, enabled: bool) -> None:
    """A mode change can stay pending until the GPU is reset: then no instance can follow."""
    gpu = next(g for g in backend.snapshot().gpus if g.index == index)
    if gpu.mig is not None and gpu.mig.current != enabled:
        state = "on" if enabled else "off"
        raise DeviceError(
            f"MIG mode {state} is pending until GPU {index} is reset "
            f"(nvidia-smi --gpu-reset -i {index}, or a reboot)"
        )
