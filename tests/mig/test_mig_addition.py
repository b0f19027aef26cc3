"""Where one more instance goes: the start that strands the fewest memory slices."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidRequest, MigLayoutError
from gpupool.mig import catalog
from gpupool.mig.addition import additions, best_addition, stranded_slices
from gpupool.mig.planner import Placement, complete_layouts, validate_layout

H100 = catalog.get_model("H100")
A30 = catalog.get_model("A30")


def test_a_1g_at_6_strands_the_last_slice_so_it_goes_elsewhere() -> None:
    # memory slice 7 has no compute slice of its own: only 3g@4, 7g or 1g.20gb@6 use it
    assert stranded_slices(H100, [Placement(6, "1g.10gb")]) == [7]
    added = best_addition(H100, [], "1g.10gb")
    assert added.stranded == 0 and added.placement.start != 6


def test_next_to_a_3g_the_1g_keeps_room_for_a_2g() -> None:
    added = best_addition(H100, [Placement(4, "3g.40gb")], "1g.10gb")
    assert added.placement == Placement(3, "1g.10gb")  # slices 0-1 stay a 2g's start
    grown = [Placement(4, "3g.40gb"), added.placement]
    assert best_addition(H100, grown, "2g.20gb").placement == Placement(0, "2g.20gb")


def test_every_place_is_listed_best_first() -> None:
    """The daemon walks this list for the best place that delays no waiting MIG job."""
    layout = [Placement(4, "3g.40gb")]
    places = additions(H100, layout, "1g.10gb")
    assert places[0] == best_addition(H100, layout, "1g.10gb")
    assert sorted(a.placement.start for a in places) == [0, 1, 2, 3]
    assert [a.stranded for a in places] == sorted(a.stranded for a in places)


@pytest.mark.parametrize(
    ("layout", "profile", "message"),
    [
        ([Placement(0, "3g.40gb"), Placement(4, "3g.40gb")], "1g.10gb", "no valid start of 1g"),
        ([Placement(0, "4g.40gb"), Placement(4, "3g.40gb")], "1g.10gb", "0 compute slices free"),
        ([Placement(0, "1g.10gb+me")], "1g.10gb+me", "it has 1 1g.10gb+me instances, the most"),
    ],
)
def test_why_not(layout: list[Placement], profile: str, message: str) -> None:
    with pytest.raises(MigLayoutError, match=re.escape(message)):
        best_addition(H100, layout, profile)


def test_a_profile_of_another_model_is_bad_input() -> None:
    with pytest.raises(InvalidRequest, match=re.escape("known: 1g.6gb")):
        best_addition(A30, [], "1g.10gb")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_an_addition_is_always_valid_and_never_worse_than_any_other_start(
    data: st.DataObject,
) -> None:
    model = data.draw(st.sampled_from([H100, A30]))
    full = data.draw(st.sampled_from(complete_layouts(model)))
    layout = list(full[: data.draw(st.integers(0, len(full)))])
    profile = data.draw(st.sampled_from([p for p in model.profiles if not p.media_extensions]))
    try:
        added = best_addition(model, layout, profile.name)
    except MigLayoutError:
        for start in profile.starts:  # then no start at all is valid
            with pytest.raises(MigLayoutError):
                validate_layout(model, [*layout, Placement(start, profile.name)])
        return
    validate_layout(model, [*layout, added.placement])
    for start in profile.starts:
        other = [*layout, Placement(start, profile.name)]
        try:
            validate_layout(model, other)
        except MigLayoutError:
            continue
        assert added.stranded <= len(stranded_slices(model, other))
