"""The planner against brute force: it finds a placement exactly when one exists."""

from collections import Counter
from functools import cache
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import MigLayoutError
from gpupool.mig.catalog import get_model
from gpupool.mig.planner import ExistingInstance, Placement, find_placements, plan_gpu

MODEL = get_model("A100-40GB")
CANDIDATES = [Placement(s, p.name) for p in MODEL.profiles for s in p.starts]


def _valid(layout: tuple[Placement, ...]) -> bool:
    used: set[int] = set()
    counts: Counter[str] = Counter()
    for placement in layout:
        profile = MODEL.profile(placement.profile)
        slots = set(profile.slots(placement.start))
        if slots & used:
            return False
        used |= slots
        counts[profile.name] += 1
    compute = sum(MODEL.profile(n).compute_slices * c for n, c in counts.items())
    return compute <= MODEL.compute_slices and all(
        c <= MODEL.profile(n).max_instances for n, c in counts.items()
    )


@cache
def achievable() -> dict[frozenset[tuple[str, int]], tuple[Placement, ...]]:
    """Every count map some valid layout has, by exhaustive enumeration (up to 7 instances)."""
    found: dict[frozenset[tuple[str, int]], tuple[Placement, ...]] = {}
    for size in range(1, 8):
        for layout in combinations(CANDIDATES, size):
            if _valid(layout):
                key = frozenset(Counter(p.profile for p in layout).items())
                found.setdefault(key, layout)
    return found


counts_strategy = st.dictionaries(
    st.sampled_from(MODEL.profile_names), st.integers(min_value=1, max_value=4), max_size=4
).filter(bool)


@settings(max_examples=300, deadline=None)
@given(counts_strategy)
def test_find_placements_succeeds_exactly_when_a_layout_exists(counts: dict[str, int]) -> None:
    exists = frozenset(counts.items()) in achievable()
    try:
        found = find_placements(MODEL, counts)
    except MigLayoutError:
        assert not exists, (
            f"a layout exists for {counts}: {achievable()[frozenset(counts.items())]}"
        )
        return
    assert exists
    assert _valid(found)
    assert Counter(p.profile for p in found) == Counter(counts)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(achievable(), key=sorted)), counts_strategy)
def test_plans_reach_the_target_and_a_second_plan_is_empty(
    current_key: frozenset[tuple[str, int]], target: dict[str, int]
) -> None:
    current = achievable()[current_key]
    existing = [ExistingInstance(n, p.profile, p.start) for n, p in enumerate(current, start=1)]
    if frozenset(target.items()) not in achievable():
        return  # not placeable: covered by the test above
    plan = plan_gpu(MODEL, True, existing, True, target)
    assert _valid(plan.final) and Counter(p.profile for p in plan.final) == Counter(target)
    assert set(plan.kept) <= set(current)
    actions = [s.action for s in plan.steps]
    assert actions == sorted(actions, key=lambda a: a != "destroy")  # destroys come first
    after = [ExistingInstance(n, p.profile, p.start) for n, p in enumerate(plan.final, start=1)]
    assert plan_gpu(MODEL, True, after, True, target).steps == ()
