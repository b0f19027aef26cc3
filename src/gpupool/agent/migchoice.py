"""Where a queued MIG job goes: the GPUs as MIG admission sees them, and the instance it takes.

A free instance of the job's profile first; else the new instance that strands the fewest
memory slices (`mig.addition`) on a GPU in MIG mode and delays no blocked job
(`agent/migwait.py`). Pure: it reads a snapshot and changes nothing on the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpupool.agent.jobs import Job, JobSpec
from gpupool.agent.migwait import Fairness
from gpupool.core.errors import InvalidRequest, MigLayoutError
from gpupool.devices.snapshot import GpuSnapshot, MigInstance, NodeSnapshot
from gpupool.mig import catalog
from gpupool.mig.addition import Addition, additions
from gpupool.mig.planner import Placement


@dataclass(frozen=True)
class MigChoice:
    """Where a queued MIG job goes: a free instance (`existing`), or a new one at `start`."""

    job: Job
    gpu: int
    profile: str
    start: int
    existing: MigInstance | None


@dataclass
class PlacingGpu:
    """One GPU as MIG admission sees it; `layout` and `free` change as a pass places jobs."""

    index: int
    model: catalog.GpuModel | None
    mig_on: bool
    layout: list[Placement]
    #: instances no job uses, in start order
    free: list[MigInstance]
    #: False when the driver hides instance placements (NVML gives them to root only)
    placements_known: bool
    #: `additions` for `layout` by profile (or why none): many queued jobs ask the same
    known_additions: dict[str, list[Addition] | MigLayoutError] = field(default_factory=dict)

    def additions(self, profile: str) -> list[Addition]:
        """Every place for a new `profile` instance, best first; MigLayoutError when none."""
        assert self.model is not None
        if profile not in self.known_additions:
            try:
                self.known_additions[profile] = additions(self.model, self.layout, profile)
            except MigLayoutError as err:
                self.known_additions[profile] = err
        found = self.known_additions[profile]
        if isinstance(found, MigLayoutError):
            raise found
        return found


def model_of(gpu: GpuSnapshot) -> catalog.GpuModel | None:
    """The catalog model of a snapshot's GPU; None for a GPU without MIG."""
    try:
        return catalog.get_model(gpu.model)
    except InvalidRequest:
        return None


def gpus_for(snapshot: NodeSnapshot, in_use: set[str], spec: JobSpec) -> list[PlacingGpu]:
    """The GPUs `spec` may use (its models), each with its instances not `in_use` free."""
    gpus = []
    for gpu in snapshot.gpus:
        if spec.gpu_models and gpu.model not in spec.gpu_models:
            continue
        instances = sorted(gpu.mig.instances if gpu.mig else (), key=lambda i: i.gi_id)
        known = all(i.placement_start is not None for i in instances)
        gpus.append(
            PlacingGpu(
                gpu.index,
                model_of(gpu),
                bool(gpu.healthy and gpu.mig is not None and gpu.mig.current),
                [Placement(i.placement_start or 0, i.profile) for i in instances],
                [i for i in instances if i.uuid is not None and i.uuid not in in_use],
                known,
            )
        )
    return gpus


def enable_hint(gpus: Iterable[PlacingGpu]) -> str:
    """What an admin runs so that the first of `gpus` can take MIG jobs."""
    index = next(iter(gpus)).index
    return (
        f"an admin turns MIG mode on first, e.g. `sudo nvidia-smi -i {index} -mig 1` (and a GPU "
        "reset), or lays out instances with `gpupool mig apply -f CONFIG.yaml -c NAME`"
    )


def profile_of(gpus: Sequence[PlacingGpu], name: str) -> str:
    """The canonical profile name, or InvalidRequest listing each model's valid profiles."""
    models = {g.model.name: g.model for g in gpus if g.model is not None}
    for model in models.values():
        if model.has_profile(name):
            return model.profile(name).name
    if not models:
        raise InvalidRequest(f"MIG profile {name!r}: no GPU of this node supports MIG")
    valid = "; ".join(f"{m.name}: {', '.join(m.profile_names)}" for m in models.values())
    raise InvalidRequest(f"unknown MIG profile {name!r} for this node's GPUs; valid: {valid}")


def instances_on(snapshot: NodeSnapshot, index: int) -> tuple[MigInstance, ...]:
    """The MIG instances of GPU `index` (none when it is gone or not in MIG mode)."""
    gpu = next((g for g in snapshot.gpus if g.index == index), None)
    return gpu.mig.instances if gpu is not None and gpu.mig is not None else ()


def choose(
    job: Job, gpus: Sequence[PlacingGpu], fairness: Fairness
) -> tuple[MigChoice | None, tuple[str, ...]]:
    """A free instance of the job's profile first; else the new instance that strands the fewest
    slices over the GPUs in MIG mode and delays no blocked job; else why not: that it would
    delay one, or one line per GPU."""
    assert job.spec.mig_profile is not None
    profile = job.spec.mig_profile
    for gpu in gpus:
        if not gpu.mig_on:
            continue
        found = next((i for i in gpu.free if i.profile == profile), None)
        if found is not None:
            start = found.placement_start or 0
            return MigChoice(job, gpu.index, profile, start, found), ()
    best: tuple[tuple[int, int, int], MigChoice] | None = None
    why = []
    victim: int | None = None
    for gpu in gpus:
        if gpu.model is None or not gpu.model.has_profile(profile):
            why.append(f"GPU {gpu.index}: no {profile} profile")
            continue
        if not gpu.mig_on:
            why.append(f"GPU {gpu.index}: MIG mode is off")
            continue
        if not gpu.placements_known:
            why.append(f"GPU {gpu.index}: no free {profile}, and its layout is unknown (not root)")
            continue
        try:
            places = gpu.additions(profile)
        except MigLayoutError as err:
            why.append(f"GPU {gpu.index}: no free {profile} instance, none can be added: {err}")
            continue
        for addition in places:  # the best place on this GPU that delays no blocked job
            delayed = fairness.delayed_by(gpu.index, addition.placement)
            if delayed is not None:
                victim = delayed if victim is None else victim
                continue
            choice = MigChoice(job, gpu.index, profile, addition.placement.start, None)
            rank = (addition.stranded, -addition.options, gpu.index)
            if best is None or rank < best[0]:
                best = (rank, choice)
            break
    if best is not None:
        return best[1], ()
    if victim is not None:
        return None, (f"it fits now, but would delay job {victim} queued ahead of it",)
    return None, tuple(why)


def take(gpu: PlacingGpu, choice: MigChoice) -> None:
    """`gpu` as it is once `choice` holds its instance."""
    if choice.existing is not None:
        gpu.free = [i for i in gpu.free if i.uuid != choice.existing.uuid]
    else:
        gpu.layout.append(Placement(choice.start, choice.profile))
        gpu.known_additions.clear()
