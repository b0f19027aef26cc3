"""MIG layout planner: validate layouts, place profile counts, list complete layouts, plan steps."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.errors import InvalidRequest, MigLayoutError
from gpupool.mig.catalog import GpuModel, MigProfile


@dataclass(frozen=True, order=True)
class Placement:
    """A GPU instance of `profile` at memory slice `start`: written `3g.40gb@4`."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True)
class LayoutSpec:
    """What a user asks for: instances at fixed places plus profile counts to place anywhere."""

    fixed: tuple[Placement, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()

    @property
    def count_map(self) -> dict[str, int]:
        return dict(self.counts)


_ITEM = re.compile(r"^(?P<profile>[0-9a-z.+\-]+?)(?:(?P<sep>[:@])(?P<number>-?\d+))?$")


def parse_layout(text: str) -> LayoutSpec:
    """`3g.40gb:1,4g.40gb:1` (counts), `3g.40gb@4` (a fixed start), or both, comma-separated.

    A bare profile name means one instance. Profile names are checked against a model later.
    """
    counts: Counter[str] = Counter()
    fixed: list[Placement] = []
    items = [item.strip().lower() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise InvalidRequest(
            f"invalid MIG layout {text!r}: use PROFILE:COUNT or PROFILE@START, comma-separated"
        )
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            raise InvalidRequest(
                f"invalid MIG layout item {item!r}: use PROFILE:COUNT (3g.40gb:2) "
                "or PROFILE@START (3g.40gb@4)"
            )
        profile, sep, number = match.group("profile", "sep", "number")
        value = int(number) if number is not None else 1
        if sep == "@":
            if value < 0:
                raise InvalidRequest(f"invalid MIG layout item {item!r}: start must be >= 0")
            fixed.append(Placement(value, profile))
        else:
            if value < 1:
                raise InvalidRequest(f"invalid MIG layout item {item!r}: count must be >= 1")
            counts[profile] += value
    return LayoutSpec(tuple(fixed), tuple(counts.items()))


def format_layout(placements: Iterable[Placement]) -> str:
    """`4g.40gb@0, 3g.40gb@4` in start order."""
    return ", ".join(str(p) for p in sorted(placements)) or "(empty)"


def _slices(first: int, last: int) -> str:
    return f"memory slice {first}" if first == last else f"memory slices {first}-{last}"


def _check_profiles(model: GpuModel, names: Iterable[str]) -> None:
    for name in names:
        model.profile(name)  # raises InvalidRequest listing the model's profiles


def _check_totals(model: GpuModel, counts: Mapping[str, int]) -> None:
    """Per-profile maxima and the slice budgets, before any search."""
    for name, count in counts.items():
        profile = model.profile(name)
        if count > profile.max_instances:
            raise MigLayoutError(
                f"{count} instances of {profile.name} on {model.name}: "
                f"at most {profile.max_instances}"
            )
    compute = sum(model.profile(n).compute_slices * c for n, c in counts.items())
    if compute > model.compute_slices:
        raise MigLayoutError(
            f"the layout needs {compute} compute slices; {model.name} has {model.compute_slices}"
        )
    memory = sum(model.profile(n).memory_slices * c for n, c in counts.items())
    if memory > model.memory_slices:
        raise MigLayoutError(
            f"the layout needs {memory} memory slices; {model.name} has {model.memory_slices}"
        )


def _check_start(model: GpuModel, placement: Placement) -> MigProfile:
    profile = model.profile(placement.profile)
    if placement.start not in profile.starts:
        raise MigLayoutError(
            f"{profile.name} cannot start at memory slice {placement.start} on {model.name}; "
            f"valid starts: {', '.join(map(str, profile.starts))}"
        )
    return profile


def validate_layout(model: GpuModel, placements: Sequence[Placement]) -> None:
    """Raise MigLayoutError (naming the instances) unless `placements` can coexist on `model`."""
    _check_profiles(model, (p.profile for p in placements))
    owner: dict[int, Placement] = {}
    for placement in sorted(placements):
        profile = _check_start(model, placement)
        taken = [s for s in profile.slots(placement.start) if s in owner]
        if taken:
            other = owner[taken[0]]
            raise MigLayoutError(
                f"{other} and {profile.name}@{placement.start} overlap on "
                f"{_slices(taken[0], taken[-1])}"
            )
        for slot in profile.slots(placement.start):
            owner[slot] = Placement(placement.start, profile.name)
    counts = Counter(model.profile(p.profile).name for p in placements)
    _check_totals(model, counts)


def _canonical(model: GpuModel, placements: Iterable[Placement]) -> tuple[Placement, ...]:
    return tuple(sorted(Placement(p.start, model.profile(p.profile).name) for p in placements))


def _search_order(model: GpuModel, counts: Mapping[str, int]) -> list[MigProfile]:
    """One entry per instance to place, largest first (memory, then compute, then name)."""
    profiles = [model.profile(name) for name, count in counts.items() for _ in range(count)]
    return sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))


class _Search:
    """Depth-first search over start slots; remembers the deepest partial layout for errors."""

    def __init__(self, model: GpuModel, todo: list[MigProfile], used: set[int]) -> None:
        self.model = model
        self.todo = todo
        self.used = used
        self.deepest: tuple[list[Placement], MigProfile | None] = ([], None)

    def run(self, depth: int = 0, chosen: list[Placement] | None = None) -> list[Placement] | None:
        chosen = [] if chosen is None else chosen
        if depth == len(self.todo):
            return list(chosen)
        profile = self.todo[depth]
        # equal profiles go in decreasing start order, so each set is tried once
        same_before = depth > 0 and self.todo[depth - 1].name == profile.name
        ceiling = chosen[-1].start - 1 if same_before else self.model.memory_slices
        for start in reversed(profile.starts):
            slots = profile.slots(start)
            if start > ceiling or any(s in self.used for s in slots):
                continue
            self.used.update(slots)
            chosen.append(Placement(start, profile.name))
            found = self.run(depth + 1, chosen)
            chosen.pop()
            self.used.difference_update(slots)
            if found is not None:
                return found
        if depth >= len(self.deepest[0]):
            self.deepest = (list(chosen), profile)
        return None


def find_placements(
    model: GpuModel, counts: Mapping[str, int], fixed: Sequence[Placement] = ()
) -> tuple[Placement, ...]:
    """Places for `counts` instances next to `fixed` ones, or MigLayoutError saying why not.

    Deterministic: instances go largest first, each at the highest free valid start (slice 0,
    the only start of the 4g and 7g profiles, stays free longest); the first complete layout
    found wins.
    """
    _check_profiles(model, itertools.chain(counts, (p.profile for p in fixed)))
    if any(count < 0 for count in counts.values()):
        raise InvalidRequest("a MIG profile count must not be negative")
    wanted = {model.profile(n).name: c for n, c in counts.items() if c > 0}
    validate_layout(model, fixed)
    total = Counter(wanted) + Counter(model.profile(p.profile).name for p in fixed)
    _check_totals(model, total)
    fixed_canon = _canonical(model, fixed)
    used = {s for p in fixed_canon for s in model.profile(p.profile).slots(p.start)}
    search = _Search(model, _search_order(model, wanted), used)
    found = search.run()
    if found is None:
        partial, stuck = search.deepest
        assert stuck is not None
        placed = format_layout([*fixed_canon, *partial])
        raise MigLayoutError(
            f"no arrangement fits on {model.name}: after {placed} no valid start is free for "
            f"{stuck.name} (valid starts: {', '.join(map(str, stuck.starts))})"
        )
    return tuple(sorted([*fixed_canon, *found]))


def place_spec(model: GpuModel, spec: LayoutSpec) -> tuple[Placement, ...]:
    """Placements for a parsed LAYOUT (fixed starts kept, counts placed around them)."""
    return find_placements(model, spec.count_map, spec.fixed)


def _candidates(model: GpuModel, profiles: Sequence[MigProfile]) -> list[tuple[MigProfile, int]]:
    pairs = [(p, s) for p in profiles for s in p.starts]
    return sorted(pairs, key=lambda ps: (ps[1], -ps[0].memory_slices, ps[0].name))


def complete_layouts(
    model: GpuModel, profile_names: Sequence[str] | None = None
) -> list[tuple[Placement, ...]]:
    """Every layout to which no further instance can be added: none leaves a usable slice idle.

    By default the `+me` profiles are left out: each has the shape of its base profile, so it
    would only repeat layouts with one instance renamed.
    """
    profiles = (
        list({model.profile(n).name: model.profile(n) for n in profile_names}.values())
        if profile_names is not None
        else [p for p in model.profiles if not p.media_extensions]
    )
    candidates = _candidates(model, profiles)
    found: list[tuple[Placement, ...]] = []
    for layout in _grow(model, candidates, 0, [], set(), Counter()):
        found.append(tuple(sorted(Placement(s, p.name) for p, s in layout)))
    return sorted(found, key=lambda layout: [(p.start, p.profile) for p in layout])


def _fits(
    model: GpuModel, profile: MigProfile, start: int, used: set[int], counts: Counter[str]
) -> bool:
    compute = sum(model.profile(n).compute_slices * c for n, c in counts.items())
    return (
        counts[profile.name] < profile.max_instances
        and compute + profile.compute_slices <= model.compute_slices
        and not any(s in used for s in profile.slots(start))
    )


def _grow(
    model: GpuModel,
    candidates: list[tuple[MigProfile, int]],
    first: int,
    chosen: list[tuple[MigProfile, int]],
    used: set[int],
    counts: Counter[str],
) -> Iterator[list[tuple[MigProfile, int]]]:
    """Sets of candidates in index order; yields those that nothing else can join."""
    extended = False
    for index in range(first, len(candidates)):
        profile, start = candidates[index]
        if not _fits(model, profile, start, used, counts):
            continue
        extended = True
        slots = profile.slots(start)
        used.update(slots)
        counts[profile.name] += 1
        chosen.append((profile, start))
        yield from _grow(model, candidates, index + 1, chosen, used, counts)
        chosen.pop()
        counts[profile.name] -= 1
        used.difference_update(slots)
    # a set is complete only if no candidate at all (earlier ones included) still fits
    if not extended and chosen and not any(_fits(model, p, s, used, counts) for p, s in candidates):
        yield list(chosen)


@dataclass(frozen=True)
class ExistingInstance:
    """A GPU instance that exists now: its id, profile and start (None when unknown)."""

    gi_id: int
    profile: str
    start: int | None


@dataclass(frozen=True)
class Step:
    """One action on one GPU: `enable`, `disable`, `destroy` (gi_id set) or `create`."""

    action: str
    profile: str | None = None
    start: int | None = None
    gi_id: int | None = None

    def __str__(self) -> str:
        if self.action == "destroy":
            where = f"@{self.start}" if self.start is not None else ""
            return f"destroy {self.profile}{where} (GPU instance {self.gi_id})"
        if self.action == "create":
            return f"create {self.profile}@{self.start}"
        return f"{self.action} MIG mode"


@dataclass(frozen=True)
class GpuPlan:
    """The steps that turn a GPU's current layout into the target, and the layout after them."""

    steps: tuple[Step, ...]
    final: tuple[Placement, ...]
    kept: tuple[Placement, ...]
    mig_enabled: bool

    @property
    def changes(self) -> bool:
        return bool(self.steps)


def plan_gpu(
    model: GpuModel,
    mig_enabled_now: bool,
    existing: Sequence[ExistingInstance],
    mig_enabled: bool,
    counts: Mapping[str, int],
) -> GpuPlan:
    """Steps from the current state to `mig_enabled` with `counts` instances; destroys first.

    An existing instance stays when the target still has its profile at its start in some
    complete placement; the plan keeps as many as it can (ties: the earlier starts).
    """
    if not mig_enabled:
        if any(c > 0 for c in counts.values()):
            raise MigLayoutError("MIG devices are listed for a GPU with mig-enabled: false")
        steps = [_destroy(i) for i in _by_start(existing)]
        if mig_enabled_now:
            steps.append(Step("disable"))
        return GpuPlan(tuple(steps), (), (), False)
    wanted = {model.profile(n).name: c for n, c in counts.items() if c > 0}
    keep, final = _best_keep(model, existing, wanted)
    kept_ids = {i.gi_id for i in keep}
    steps = [] if mig_enabled_now else [Step("enable")]
    steps += [_destroy(i) for i in _by_start(existing) if i.gi_id not in kept_ids]
    kept = _canonical(model, [Placement(i.start or 0, i.profile) for i in keep])
    steps += [Step("create", p.profile, p.start) for p in final if p not in kept]
    return GpuPlan(tuple(steps), final, kept, True)


def _by_start(existing: Sequence[ExistingInstance]) -> list[ExistingInstance]:
    return sorted(existing, key=lambda i: (i.start if i.start is not None else -1, i.gi_id))


def _destroy(instance: ExistingInstance) -> Step:
    return Step("destroy", instance.profile, instance.start, instance.gi_id)


def _best_keep(
    model: GpuModel, existing: Sequence[ExistingInstance], wanted: Mapping[str, int]
) -> tuple[list[ExistingInstance], tuple[Placement, ...]]:
    """The largest set of existing instances that a complete target placement can include."""
    keepable = [
        i
        for i in _by_start(existing)
        if i.start is not None and model.has_profile(i.profile)
        if model.profile(i.profile).name in wanted
    ]
    for size in range(len(keepable), -1, -1):
        for subset in itertools.combinations(keepable, size):
            fixed = [Placement(i.start or 0, model.profile(i.profile).name) for i in subset]
            remaining = Counter(wanted)
            remaining.subtract(Counter(p.profile for p in fixed))
            if any(c < 0 for c in remaining.values()):
                continue
            try:
                final = find_placements(model, dict(remaining), fixed)
            except MigLayoutError:
                continue
            return list(subset), final
    # nothing kept: the target alone must fit, or its reason is the answer
    return [], find_placements(model, wanted)


def free_slices(model: GpuModel, placements: Iterable[Placement]) -> list[int]:
    """Memory slices no instance of `placements` occupies."""
    used = {s for p in placements for s in model.profile(p.profile).slots(p.start)}
    return [s for s in range(model.memory_slices) if s not in used]


def room(model: GpuModel, placements: Sequence[Placement]) -> dict[str, int]:
    """For each profile, how many more instances of it alone would still fit next to these."""
    validate_layout(model, placements)
    counts = Counter(model.profile(p.profile).name for p in placements)
    more: dict[str, int] = {}
    for profile in model.profiles:
        fits = 0
        for extra in range(1, profile.max_instances - counts[profile.name] + 1):
            try:
                find_placements(model, {profile.name: extra}, placements)
            except MigLayoutError:
                break
            fits = extra
        more[profile.name] = fits
    return more
