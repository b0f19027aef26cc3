"""Simulator outputs: curves CSV, JSON summary, the unallocated-GPU plot, a published comparison."""

from __future__ import annotations

import csv
import json
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import ConfigError, InvalidRequest, not_utf8
from gpupool.sim.metrics import (
    HEADLINE_PCTS,
    MAX_ARRIVED_PCT,
    FloatArray,
    ideal_unalloc_pct,
    mean_headline,
)
from gpupool.sim.runner import RunResult

CURVES_FILE = "curves.csv"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "unallocated.png"
COMPARISON_FILE = "comparison.csv"
#: the paper's results for `default`, beside the checkout as the trace is
DEFAULT_PUBLISHED_RELPATH = Path("..") / "shared" / "benchmarks" / "fgd_published_default.csv"

#: the published CSV's policy names -> ours
PUBLISHED_POLICY_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}
_PUBLISHED_COLUMNS = ("workload", "sc_policy", "arrived_pct", "unalloc_gpu_pct_mean")


def _rounded(value: float, digits: int = 3) -> float | None:
    """JSON has no NaN: a point without data becomes null."""
    return None if math.isnan(value) else round(value, digits)


def _cell(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.4f}"


def write_curves_csv(path: Path, results: Sequence[RunResult]) -> None:
    """One row per run and arrived % (0..130)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["workload", "policy", "seed", "arrived_pct", "unalloc_pct", "frag_pct", "frag_ratio"]
        )
        for result in results:
            c = result.curves
            for i, pct in enumerate(c.arrived_pct):
                writer.writerow(
                    [
                        result.spec.workload,
                        result.spec.policy,
                        result.spec.seed,
                        int(pct),
                        _cell(float(c.unalloc_pct[i])),
                        _cell(float(c.frag_pct[i])),
                        _cell(float(c.frag_ratio[i])),
                    ]
                )


def _policies_in_order(results: Sequence[RunResult]) -> list[str]:
    return list(dict.fromkeys(result.spec.policy for result in results))


def mean_by_policy(results: Sequence[RunResult]) -> dict[str, dict[int, float]]:
    """Mean over seeds of the headline unallocated GPU % per policy, in run order."""
    grouped: dict[str, list[dict[int, float]]] = defaultdict(list)
    for result in results:
        grouped[result.spec.policy].append(result.curves.headline())
    return {policy: mean_headline(grouped[policy]) for policy in _policies_in_order(results)}


def summary(results: Sequence[RunResult]) -> dict[str, Any]:
    """The `--json` object: every run's headline points, and the mean per policy."""
    runs = [
        {
            "workload": result.spec.workload,
            "policy": result.spec.policy,
            "seed": result.spec.seed,
            "unallocated_pct": {
                str(pct): _rounded(value) for pct, value in result.curves.headline().items()
            },
            "pods": result.pods,
            "failed_pods": result.failed_pods,
            "seconds": round(result.seconds, 3),
        }
        for result in results
    ]
    mean = {
        policy: {str(pct): _rounded(value) for pct, value in points.items()}
        for policy, points in mean_by_policy(results).items()
    }
    return {"runs": runs, "mean": mean}


def write_summary_json(path: Path, results: Sequence[RunResult]) -> None:
    """The summary object, as `--json` prints it."""
    path.write_text(json.dumps(summary(results), indent=2) + "\n", encoding="utf-8")


#: the line a user sees when a plot is asked for and the `plot` extra is not installed
PLOT_HINT = "the plot needs matplotlib: pip install 'gpupool[plot]'"


def check_plotting() -> None:
    """Refuse, before any replay runs, a plot that could not be drawn (matplotlib is an extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidRequest(PLOT_HINT) from None


def plot_unallocated(path: Path, results: Sequence[RunResult], title: str) -> None:
    """Unallocated GPU % against arrived % per policy (mean over seeds), with the ideal line."""
    # The object API with the Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    x = np.arange(MAX_ARRIVED_PCT + 1, dtype=np.int64)
    axes.plot(x, ideal_unalloc_pct(x), color="black", linestyle="--", linewidth=1, label="ideal")
    for policy in _policies_in_order(results):
        seeds = sum(1 for r in results if r.spec.policy == policy)
        label = f"{policy} ({seeds} seed{'s' * (seeds > 1)}{', band: min-max' * (seeds > 1)})"
        color, style = _style(policy)
        low, high = _seed_spread(results, policy)
        axes.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
        axes.plot(x, _mean_curve(results, policy), color=color, ls=style, lw=1.6, label=label)
    axes.set_xlim(0, 130)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("arrived workload (% of cluster GPU capacity)")
    axes.set_ylabel("unallocated GPUs (% of cluster)")
    figure.suptitle("Unallocated GPUs as the workload arrives", fontsize=12)
    axes.set_title(title, fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower left")
    _add_zoom(axes, results, x)
    figure.tight_layout()
    figure.savefig(path)


#: one colour per policy in every plot, from the Okabe-Ito palette (told apart with any colour
#: vision deficiency); the two share-scheduler policies reuse a colour with a dashed line
_POLICY_STYLE: dict[str, tuple[str, str]] = {
    "gpupool": ("#D55E00", "-"),  # vermillion
    "fgd": ("#0072B2", "-"),  # blue
    "bestfit": ("#009E73", "-"),  # bluish green
    "random": ("#999999", "-"),  # grey
    "packing": ("#E69F00", "-"),  # orange
    "dotprod": ("#56B4E9", "-"),  # sky blue
    "clustering": ("#CC79A7", "-"),  # reddish purple
    "binpack": ("#E69F00", "--"),
    "spread": ("#56B4E9", "--"),
}


def _style(policy: str) -> tuple[str, str]:
    """The colour and line style of `policy`, the same in the plot, its inset and every run."""
    return _POLICY_STYLE.get(policy, ("#000000", ":"))


def _seed_spread(results: Sequence[RunResult], policy: str) -> tuple[FloatArray, FloatArray]:
    """The lowest and highest unallocated % over the seeds of `policy`, per arrived %."""
    stack = np.vstack([r.curves.unalloc_pct for r in results if r.spec.policy == policy])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN bins stay gaps
        low, high = np.nanmin(stack, axis=0), np.nanmax(stack, axis=0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def _mean_curve(results: Sequence[RunResult], policy: str) -> FloatArray:
    stack = np.vstack([r.curves.unalloc_pct for r in results if r.spec.policy == policy])
    with warnings.catch_warnings():
        # A bin empty in every seed stays NaN (a gap in the line), which is what it should show.
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmean(stack, axis=0), dtype=np.float64)


def _add_zoom(axes: Any, results: Sequence[RunResult], x: npt.NDArray[np.int64]) -> None:
    """An inset on 90..130 %, where the policies differ by a few points only."""
    if not results:
        return
    # Upper right: every curve lies below 100 - X there, so the inset hides no data.
    inset = axes.inset_axes((0.52, 0.5, 0.36, 0.42))
    ends: list[tuple[float, str, str]] = []
    for policy in _policies_in_order(results):
        color, style = _style(policy)
        curve = _mean_curve(results, policy)
        low, high = _seed_spread(results, policy)
        inset.fill_between(x[90:], low[90:], high[90:], color=color, alpha=0.2, linewidth=0)
        inset.plot(x[90:], curve[90:], color=color, ls=style, lw=1.4)
        finite = curve[90:][np.isfinite(curve[90:])]
        if finite.size:
            ends.append((float(finite[-1]), policy, color))
    _label_ends(inset, ends)
    inset.set_xlim(90, 130)
    inset.set_title("zoom: 90-130 % arrived", fontsize=8)
    inset.set_xlabel("arrived %", fontsize=7, labelpad=1)
    inset.set_ylabel("unallocated %", fontsize=7, labelpad=1)
    inset.tick_params(labelsize=7)
    inset.grid(True, alpha=0.3)


def _label_ends(inset: Any, ends: list[tuple[float, str, str]]) -> None:
    """Name each curve at its right end, outside the inset, nudged apart so no two overlap."""
    if not ends:
        return
    bottom, top = inset.get_ylim()
    gap = (top - bottom) * 0.09
    placed: list[float] = []
    for value, policy, color in sorted(ends):
        y = value if not placed else max(value, placed[-1] + gap)
        placed.append(y)
        inset.annotate(
            policy,
            (130, value),
            xytext=(132, y),
            textcoords="data",
            fontsize=7,
            color=color,
            va="center",
            annotation_clip=False,
        )


@dataclass(frozen=True)
class PublishedPoint:
    """One published value: mean (and sd) of unallocated GPU % over `seeds` runs."""

    mean: float
    sd: float
    seeds: int


def _published_float(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{path.name}:{line}: column {column}: {text!r} is not a number"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(f"{path.name}:{line}: column {column}: {text!r} is not a finite number")
    return value


def load_published(path: Path, workload: str) -> dict[tuple[str, int], PublishedPoint]:
    """(our policy name, arrived %) -> published point, for `workload`, from a CSV in the
    format of fgd_published_default.csv; rows of other workloads are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read published results {str(path)!r}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise not_utf8(str(path), err) from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in _PUBLISHED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{path.name}:1: missing column(s) {', '.join(missing)}")
    points: dict[tuple[str, int], PublishedPoint] = {}
    for row in reader:
        line = reader.line_num
        if row["workload"].strip() not in (workload, f"openb_pod_list_{workload}"):
            continue
        name = row["sc_policy"].strip()
        policy = PUBLISHED_POLICY_NAMES.get(name, name.lower())
        pct = _published_float(path, line, "arrived_pct", row["arrived_pct"])
        mean = _published_float(path, line, "unalloc_gpu_pct_mean", row["unalloc_gpu_pct_mean"])
        sd_text = (row.get("unalloc_gpu_pct_sd") or "").strip()
        sd = _published_float(path, line, "unalloc_gpu_pct_sd", sd_text) if sd_text else math.nan
        seeds_text = (row.get("n_seeds") or "").strip()
        seeds = int(_published_float(path, line, "n_seeds", seeds_text)) if seeds_text else 0
        points[(policy, round(pct))] = PublishedPoint(mean, sd, seeds)
    return points


@dataclass(frozen=True)
class ComparisonRow:
    """Ours beside the published value at one (policy, arrived %)."""

    policy: str
    arrived_pct: int
    ours_mean: float
    ours_sd: float
    seeds: int
    published_mean: float
    published_sd: float

    @property
    def delta(self) -> float:
        """Ours minus published, in points of unallocated GPU % (NaN when nothing published)."""
        return self.ours_mean - self.published_mean


def compare(
    results: Sequence[RunResult], published: dict[tuple[str, int], PublishedPoint]
) -> list[ComparisonRow]:
    """A row per policy we ran and headline arrived %; published NaN where the CSV has none."""
    rows: list[ComparisonRow] = []
    for policy in _policies_in_order(results):
        runs = [r for r in results if r.spec.policy == policy]
        for pct in HEADLINE_PCTS:
            values = np.array([r.curves.at(pct) for r in runs], dtype=np.float64)
            values = values[np.isfinite(values)]
            point = published.get((policy, pct), PublishedPoint(math.nan, math.nan, 0))
            rows.append(
                ComparisonRow(
                    policy=policy,
                    arrived_pct=pct,
                    ours_mean=float(values.mean()) if values.size else math.nan,
                    ours_sd=float(values.std(ddof=1)) if values.size > 1 else math.nan,
                    seeds=int(values.size),
                    published_mean=point.mean,
                    published_sd=point.sd,
                )
            )
    return rows


def write_comparison_csv(path: Path, rows: Sequence[ComparisonRow]) -> None:
    """The comparison table as CSV (empty cells where a value is missing)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "policy",
                "arrived_pct",
                "ours_mean",
                "ours_sd",
                "seeds",
                "published_mean",
                "published_sd",
                "delta",
            ]
        )
        for row in rows:
            writer.writerow(
                [
                    row.policy,
                    row.arrived_pct,
                    _cell(row.ours_mean),
                    _cell(row.ours_sd),
                    row.seeds,
                    _cell(row.published_mean),
                    _cell(row.published_sd),
                    _cell(row.delta),
                ]
            )


def write_outputs(
    out: Path,
    results: Sequence[RunResult],
    title: str,
    comparison: Sequence[ComparisonRow] = (),
) -> list[Path]:
    """Curves CSV, summary JSON, the plot and (when given) the comparison, into `out`."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = [out / CURVES_FILE, out / SUMMARY_FILE, out / PLOT_FILE]
        write_curves_csv(written[0], results)
        write_summary_json(written[1], results)
        plot_unallocated(written[2], results, title)
        if comparison:
            written.append(out / COMPARISON_FILE)
            write_comparison_csv(written[-1], comparison)
    except OSError as err:
        raise ConfigError(f"cannot write results to {str(out)!r}: {err.strerror or err}") from err
    return written
