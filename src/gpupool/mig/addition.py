"""Where one more MIG instance goes on a GPU that already has some: the start that strands the
fewest memory slices.

A memory slice is *stranded* when it is free but no instance of any profile could still use it
next to the layout (every start covering it overlaps, or the profile's maximum or the compute
slices are used up). The node daemon creates a job's instance at the start with the fewest
stranded slices; among equals, the one that leaves the most ways to place further instances, then
the highest start, as the planner places (slice 0, the only start of 4g and 7g, stays free
longest).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.core.errors import MigLayoutError
from gpupool.mig.catalog import GpuModel, MigProfile
from gpupool.mig.planner import Placement, format_layout, free_slices, validate_layout


@dataclass(frozen=True, order=True)
class Addition:
    """A place for the new instance and what it leaves: `stranded` slices, `options` (profile,
    start) pairs that could still be added."""

    stranded: int
    options: int
    placement: Placement


def _open_places(model: GpuModel, layout: Sequence[Placement]) -> list[tuple[MigProfile, int]]:
    """Every (profile, start) that could be added to `layout` as it is."""
    used = {s for p in layout for s in model.profile(p.profile).slots(p.start)}
    counts = Counter(model.profile(p.profile).name for p in layout)
    compute = sum(model.profile(n).compute_slices * c for n, c in counts.items())
    return [
        (profile, start)
        for profile in model.profiles
        for start in profile.starts
        if counts[profile.name] < profile.max_instances
        and compute + profile.compute_slices <= model.compute_slices
        and not any(s in used for s in profile.slots(start))
    ]


def stranded_slices(model: GpuModel, layout: Sequence[Placement]) -> list[int]:
    """The free memory slices of `layout` that no further instance could use."""
    usable = {s for profile, start in _open_places(model, layout) for s in profile.slots(start)}
    return [s for s in free_slices(model, layout) if s not in usable]


def best_addition(model: GpuModel, layout: Sequence[Placement], profile_name: str) -> Addition:
    """The place for one more `profile_name` instance next to `layout` that strands the fewest
    slices; MigLayoutError saying why when it has none. InvalidRequest for a profile the model
    does not have."""
    return additions(model, layout, profile_name)[0]


def additions(model: GpuModel, layout: Sequence[Placement], profile_name: str) -> list[Addition]:
    """Every place for one more `profile_name` instance next to `layout`, best first (as
    `best_addition` ranks them); MigLayoutError saying why when there is none."""
    profile = model.profile(profile_name)
    validate_layout(model, layout)
    counts = Counter(model.profile(p.profile).name for p in layout)
    if counts[profile.name] >= profile.max_instances:
        raise MigLayoutError(
            f"it has {counts[profile.name]} {profile.name} instances, the most {model.name} allows"
        )
    compute = sum(model.profile(n).compute_slices * c for n, c in counts.items())
    if compute + profile.compute_slices > model.compute_slices:
        free = model.compute_slices - compute
        raise MigLayoutError(
            f"{free} compute slice{'' if free == 1 else 's'} free, {profile.name} needs "
            f"{profile.compute_slices}"
        )
    found = []
    for start in profile.starts:
        grown = [*layout, Placement(start, profile.name)]
        try:
            validate_layout(model, grown)
        except MigLayoutError:
            continue
        open_places = len(_open_places(model, grown))
        found.append(Addition(len(stranded_slices(model, grown)), open_places, grown[-1]))
    if not found:
        raise MigLayoutError(
            f"no valid start of {profile.name} ({', '.join(map(str, profile.starts))}) is free "
            f"next to {format_layout(layout) or 'nothing'}"
        )
    # fewest stranded, then most options left, then the highest start
    return sorted(found, key=lambda a: (a.stranded, -a.options, -a.placement.start))
