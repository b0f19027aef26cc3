"""Metrics binning on hand-made per-event arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpupool.core.errors import InvalidRequest
from gpupool.sim.metrics import curves, ideal_unalloc_pct, mean_headline

CLUSTER = 10_000  # milli: 1 % of it is 100 milli


def test_events_are_averaged_per_rounded_arrived_percent() -> None:
    # arrived 0.9 %, 1.2 % (bin 1) and 1.6 % (bin 2); allocation 1 %, 0.5 %, 1.6 %
    c = curves([90, 120, 160], [100, 50, 160], [0, 0, 0], [1000, 1000, 1000], CLUSTER)
    assert c.alloc_pct[1] == pytest.approx(0.75)
    assert c.unalloc_pct[1] == pytest.approx(99.25)
    assert c.alloc_pct[2] == pytest.approx(1.6)
    assert len(c.arrived_pct) == 131
    assert c.arrived_pct[0] == 0 and c.arrived_pct[130] == 130


def test_an_empty_bin_takes_the_events_within_one_point() -> None:
    # events at 1.0 % (bin 1) and 3.4 % (bin 3); bins 2 and 4 are empty
    c = curves([100, 340], [100, 300], [0, 0], [0, 0], CLUSTER)
    assert c.alloc_pct[2] == pytest.approx(1.0)  # |1.0 - 2| <= 1, |3.4 - 2| > 1
    assert c.alloc_pct[4] == pytest.approx(3.0)  # empty, 3.4 within 1 of 4
    assert math.isnan(c.alloc_pct[10])  # nothing near: NaN, not a made-up value


def test_fragmentation_amount_and_ratio() -> None:
    c = curves([500, 500], [200, 400], [100, 300], [400, 800], CLUSTER)
    assert c.frag_pct[5] == pytest.approx(2.0)  # mean 200 milli of 10 000
    assert c.frag_ratio[5] == pytest.approx(200 / 600)
    idle_zero = curves([500], [500], [0], [0], CLUSTER)
    assert math.isnan(idle_zero.frag_ratio[5])


def test_headline_points() -> None:
    arrived = np.arange(0, 131 * 100, 50)  # every half percent up to 130.5 %
    allocated = np.minimum(arrived, 9_000)  # everything placed up to 90 % of the cluster
    c = curves(arrived, allocated, np.zeros_like(arrived), np.zeros_like(arrived), CLUSTER)
    head = c.headline()
    assert list(head) == [90, 95, 100, 110, 120, 130]
    assert head[100] == pytest.approx(10.0)
    assert head[130] == pytest.approx(10.0)
    assert c.at(50) == pytest.approx(50.0, abs=0.3)


def test_mean_headline_skips_missing_points() -> None:
    assert mean_headline([{100: 4.0}, {100: 6.0}, {100: math.nan}]) == {100: 5.0}
    assert mean_headline([]) == {}


def test_ideal_line() -> None:
    assert list(ideal_unalloc_pct([0, 50, 100, 130])) == [100.0, 50.0, 0.0, 0.0]


def test_bad_arrays_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="equal length"):
        curves([1, 2], [1], [1, 2], [1, 2], CLUSTER)
    with pytest.raises(InvalidRequest, match="cluster GPU milli 0"):
        curves([1], [1], [1], [1], 0)
