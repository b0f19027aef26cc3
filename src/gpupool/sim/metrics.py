"""Curves per integer arrived %: allocation, unallocated GPU %, fragmentation amount and ratio."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidRequest

#: arrived % bins of the curves: 0, 1, ..., 130
MAX_ARRIVED_PCT = 130
#: the points the paper reports (unallocated GPU % at these arrived %)
HEADLINE_PCTS = (90, 95, 100, 110, 120, 130)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Curves:
    """One value per arrived % in 0..130; NaN where no event lies within 1 point of the bin."""

    arrived_pct: npt.NDArray[np.int64]
    alloc_pct: FloatArray
    unalloc_pct: FloatArray
    frag_pct: FloatArray
    #: fragment GPU milli / idle GPU milli (a fraction, 0..1)
    frag_ratio: FloatArray

    def at(self, pct: int) -> float:
        """Unallocated GPU % at arrived % `pct`."""
        return float(self.unalloc_pct[pct])

    def headline(self) -> dict[int, float]:
        """Unallocated GPU % at the paper's points (90, 95, 100, 110, 120, 130)."""
        return {pct: self.at(pct) for pct in HEADLINE_PCTS}


def _bin_means(bins: npt.NDArray[np.int64], values: FloatArray) -> FloatArray:
    """Mean of `values` per integer bin 0..MAX; NaN where a bin has no event."""
    size = MAX_ARRIVED_PCT + 1
    inside = (bins >= 0) & (bins < size)
    counts = np.bincount(bins[inside], minlength=size)
    sums = np.bincount(bins[inside], weights=values[inside], minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def _fill_empty(means: FloatArray, arrived_pct: FloatArray, values: FloatArray) -> FloatArray:
    """An empty bin X takes the mean over the events with arrived % within X +- 1."""
    filled = means.copy()
    for pct in np.flatnonzero(np.isnan(means)):
        near = np.abs(arrived_pct - pct) <= 1.0
        if near.any():
            filled[pct] = values[near].mean()
    return filled


def _binned(arrived_pct: FloatArray, values: FloatArray) -> FloatArray:
    bins = np.rint(arrived_pct).astype(np.int64)
    return _fill_empty(_bin_means(bins, values), arrived_pct, values)


def curves(
    arrived_milli: npt.ArrayLike,
    allocated_milli: npt.ArrayLike,
    fragment_milli: npt.ArrayLike,
    idle_milli: npt.ArrayLike,
    cluster_milli: int,
) -> Curves:
    """Bin per-event cluster counters (GPU milli after each pod event) by arrived %."""
    if cluster_milli <= 0:
        raise InvalidRequest(f"invalid cluster GPU milli {cluster_milli}: must be positive")
    arrays = [
        np.asarray(a, dtype=np.float64)
        for a in (arrived_milli, allocated_milli, fragment_milli, idle_milli)
    ]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise InvalidRequest("per-event arrays must be one-dimensional and of equal length")
    arrived, allocated, fragment, idle = arrays
    arrived_pct = arrived / cluster_milli * 100.0
    alloc_pct = _binned(arrived_pct, allocated / cluster_milli * 100.0)
    frag_pct = _binned(arrived_pct, fragment / cluster_milli * 100.0)
    idle_pct = _binned(arrived_pct, idle / cluster_milli * 100.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        # A ratio of bin means: per-event ratios blow up when a bin's idle milli is near 0.
        frag_ratio = np.where(idle_pct > 0, frag_pct / idle_pct, np.nan)
    return Curves(
        arrived_pct=np.arange(MAX_ARRIVED_PCT + 1, dtype=np.int64),
        alloc_pct=alloc_pct,
        unalloc_pct=100.0 - alloc_pct,
        frag_pct=frag_pct,
        frag_ratio=frag_ratio,
    )


def mean_headline(runs: list[dict[int, float]]) -> dict[int, float]:
    """Mean over runs of each headline point (NaN points are skipped)."""
    if not runs:
        return {}
    means: dict[int, float] = {}
    for pct in runs[0]:
        values = np.array([run[pct] for run in runs], dtype=np.float64)
        finite = values[np.isfinite(values)]
        means[pct] = float(finite.mean()) if finite.size else float("nan")
    return means


def ideal_unalloc_pct(arrived_pct: npt.ArrayLike) -> FloatArray:
    """The best any policy can do: every arrived pod placed, so 100 - X up to 100, then 0."""
    return np.clip(100.0 - np.asarray(arrived_pct, dtype=np.float64), 0.0, None)
