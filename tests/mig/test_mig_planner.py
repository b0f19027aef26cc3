"""The MIG planner: layout validation, placement search, complete layouts, step planning."""

import pytest

from gpupool.core.errors import InvalidRequest, MigLayoutError
from gpupool.mig.catalog import get_model
from gpupool.mig.planner import (
    ExistingInstance,
    Placement,
    complete_layouts,
    find_placements,
    format_layout,
    parse_layout,
    place_spec,
    plan_gpu,
    validate_layout,
)

A100_40 = get_model("A100-40GB")
H100 = get_model("H100")
A30 = get_model("A30")


def test_parse_layout_counts_fixed_and_bare_names() -> None:
    spec = parse_layout("3g.40gb:1, 4g.40gb, 1g.10gb:2,3g.40gb@4")
    assert spec.count_map == {"3g.40gb": 1, "4g.40gb": 1, "1g.10gb": 2}
    assert spec.fixed == (Placement(4, "3g.40gb"),)


@pytest.mark.parametrize("text", ["", "3g.40gb:", "3g.40gb:0", ",3g.40gb", "3g.40gb:x", "a b"])
def test_parse_layout_rejects_malformed_items(text: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid MIG layout"):
        parse_layout(text)


def test_overlap_names_both_instances_and_the_slices() -> None:
    with pytest.raises(
        MigLayoutError, match=r"3g.20gb@0 and 2g.10gb@2 overlap on memory slices 2-3"
    ):
        validate_layout(A100_40, [Placement(2, "2g.10gb"), Placement(0, "3g.20gb")])


def test_invalid_start_lists_the_valid_ones() -> None:
    with pytest.raises(MigLayoutError, match=r"3g.20gb cannot start at memory slice 2.*0, 4"):
        validate_layout(A100_40, [Placement(2, "3g.20gb")])


def test_too_many_instances_of_a_profile() -> None:
    layout = [Placement(s, "1g.5gb+me") for s in (0, 1)]
    with pytest.raises(MigLayoutError, match=r"2 instances of 1g.5gb\+me.*at most 1"):
        validate_layout(A100_40, layout)


def test_valid_layout_passes() -> None:
    validate_layout(
        A100_40, [Placement(0, "4g.20gb"), Placement(4, "2g.10gb"), Placement(6, "1g.5gb")]
    )


def test_find_placements_largest_first_highest_start() -> None:
    found = find_placements(H100, {"1g.10gb": 1, "3g.40gb": 1, "2g.20gb": 1})
    # slice 0 stays free: room for another 1g; 3g@0, 2g@4, 1g@6 would leave only slice 7
    assert format_layout(found) == "1g.10gb@1, 2g.20gb@2, 3g.40gb@4"
    assert format_layout(find_placements(H100, {"1g.10gb": 2})) == "1g.10gb@5, 1g.10gb@6"
    assert find_placements(A100_40, {"3g.20gb": 1, "4g.20gb": 1}) == (
        Placement(0, "4g.20gb"),
        Placement(4, "3g.20gb"),
    )


def test_find_placements_backtracks() -> None:
    # 1g.10gb (2 memory slices) first at 0 would leave only 5 single slices for six 1g.5gb
    found = find_placements(A100_40, {"1g.5gb": 6, "1g.10gb": 1})
    assert Placement(6, "1g.10gb") in found
    validate_layout(A100_40, found)


def test_find_placements_says_why_not() -> None:
    with pytest.raises(MigLayoutError, match="needs 8 compute slices; A100-40GB has 7"):
        find_placements(A100_40, {"4g.20gb": 1, "2g.10gb": 2})
    with pytest.raises(MigLayoutError, match="needs 9 memory slices; A100-40GB has 8"):
        find_placements(A100_40, {"3g.20gb": 2, "1g.5gb": 1})
    with pytest.raises(MigLayoutError, match=r"after 2g.10gb@2 no valid start is free for 4g.20gb"):
        find_placements(A100_40, {"4g.20gb": 1}, [Placement(2, "2g.10gb")])


def test_find_placements_unknown_profile_lists_known() -> None:
    with pytest.raises(InvalidRequest, match=r"unknown MIG profile '3g.40gb' for A100-40GB; known"):
        find_placements(A100_40, {"3g.40gb": 1})


def test_place_spec_keeps_fixed_starts() -> None:
    found = place_spec(A100_40, parse_layout("3g.20gb@0,3g.20gb:1"))
    assert found == (Placement(0, "3g.20gb"), Placement(4, "3g.20gb"))


def test_a100_complete_layouts_match_the_user_guide() -> None:
    classic = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    layouts = complete_layouts(A100_40, classic)
    # the MIG user guide's A100 diagram shows 19 combinations of these five profiles
    assert len(layouts) == 19
    assert (Placement(0, "4g.20gb"), Placement(4, "3g.20gb")) in layouts
    assert (Placement(0, "7g.40gb"),) in layouts
    for layout in layouts:
        validate_layout(A100_40, layout)


def test_complete_layouts_with_double_memory_1g_and_a30() -> None:
    # left half: 4g, 3g, or two 2-slice blocks of {2g, 1g+1g, 1g.10gb} = 11 choices;
    # right half: 3g, or a {2g, 1g+1g, 1g.10gb} block and {1g@6, 1g.10gb@6} = 7; plus 7g
    assert len(complete_layouts(A100_40)) == 11 * 7 + 1
    assert len(complete_layouts(A30)) == 5
    for layout in complete_layouts(A30):
        assert sum(A30.profile(p.profile).compute_slices for p in layout) == 4


def test_plan_keeps_instances_that_can_stay() -> None:
    existing = [ExistingInstance(1, "3g.40gb", 4), ExistingInstance(2, "3g.40gb", 0)]
    plan = plan_gpu(H100, True, existing, True, {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    assert plan.kept == (Placement(4, "3g.40gb"),)
    assert [str(s) for s in plan.steps] == [
        "destroy 3g.40gb@0 (GPU instance 2)",
        "create 1g.10gb@0",
        "create 1g.10gb@1",
        "create 2g.20gb@2",
    ]
    assert format_layout(plan.final) == "1g.10gb@0, 1g.10gb@1, 2g.20gb@2, 3g.40gb@4"


def test_plan_for_the_current_layout_is_empty() -> None:
    existing = [ExistingInstance(7, "4g.40gb", 0), ExistingInstance(8, "3g.40gb", 4)]
    plan = plan_gpu(H100, True, existing, True, {"4g.40gb": 1, "3g.40gb": 1})
    assert plan.steps == () and not plan.changes


def test_plan_enables_then_creates_and_disables_after_destroying() -> None:
    plan = plan_gpu(A30, False, [], True, {"2g.12gb": 2})
    assert [s.action for s in plan.steps] == ["enable", "create", "create"]
    plan = plan_gpu(A30, True, [ExistingInstance(3, "4g.24gb", 0)], False, {})
    assert [str(s) for s in plan.steps] == [
        "destroy 4g.24gb@0 (GPU instance 3)",
        "disable MIG mode",
    ]


def test_plan_destroys_unknown_placements_and_fails_with_the_reason() -> None:
    plan = plan_gpu(H100, True, [ExistingInstance(5, "7g.80gb", None)], True, {"7g.80gb": 1})
    assert [s.action for s in plan.steps] == ["destroy", "create"]
    with pytest.raises(MigLayoutError, match="needs 10 compute slices"):
        plan_gpu(H100, True, [], True, {"7g.80gb": 1, "3g.40gb": 1})


def test_complete_layouts_ignore_a_repeated_profile_name() -> None:
    once = complete_layouts(A30, ["2g.12gb", "4g.24gb"])
    assert complete_layouts(A30, ["2g.12gb", "2G.12GB", "4g.24gb"]) == once
    assert [format_layout(layout) for layout in once] == ["2g.12gb@0, 2g.12gb@2", "4g.24gb@0"]
