"""distinct_fitting: one candidate GPU per distinct free value in a row, the lowest slot."""

from __future__ import annotations

import numpy as np

from gpupool.scheduler.fgd import distinct_fitting


def _reference(free: np.ndarray, milli: int) -> set[tuple[int, int]]:
    found: set[tuple[int, int]] = set()
    for row, values in enumerate(free.tolist()):
        seen: set[int] = set()
        for col, value in enumerate(values):
            if value >= milli and value not in seen:
                found.add((row, col))
            seen.add(value)
    return found


def test_matches_the_first_slot_of_each_distinct_free_value() -> None:
    rng = np.random.default_rng(7)
    for width in (1, 2, 8):
        free = rng.choice(np.array([-1, 0, 190, 500, 810, 1000]), size=(50, width))
        for milli in (100, 500, 1000):
            rows, cols = distinct_fitting(free, milli)
            got = list(zip(rows.tolist(), cols.tolist(), strict=True))
            assert set(got) == _reference(free, milli)
            assert len(got) == len(set(got))
            # row-major, by column: what the per-row reduction of the caller relies on
            assert got == sorted(got)


def test_a_repeated_value_below_the_ask_does_not_hide_a_later_fit() -> None:
    free = np.array([[300, 300, 900, 900, 1000]])
    rows, cols = distinct_fitting(free, 800)
    assert cols.tolist() == [2, 4] and rows.tolist() == [0, 0]
