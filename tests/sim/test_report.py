"""Report outputs: curves CSV, summary JSON, the plot, the comparison with a published CSV."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpupool.core.errors import ConfigError
from gpupool.sim import report
from gpupool.sim.metrics import curves
from gpupool.sim.runner import RunResult, RunSpec

CLUSTER = 100_000


def fake_run(policy: str, seed: int, final_unalloc_pct: float) -> RunResult:
    """A run whose allocation follows arrival up to 100 - `final_unalloc_pct` %, then stays."""
    arrived = np.arange(250, CLUSTER * 13 // 10 + 1, 250)
    allocated = np.minimum(arrived, CLUSTER * (100 - final_unalloc_pct) / 100)
    idle = CLUSTER - allocated
    return RunResult(
        spec=RunSpec("default", policy, seed),
        curves=curves(arrived, allocated, idle / 2, idle, CLUSTER),
        pods=len(arrived),
        failed_pods=7,
        seconds=1.25,
        replay_seconds=1.0,
        peak_rss_bytes=1 << 27,
    )


RESULTS = [fake_run("fgd", 42, 4.0), fake_run("fgd", 43, 6.0), fake_run("bestfit", 42, 7.0)]


def test_summary_has_the_json_schema() -> None:
    summary = report.summary(RESULTS)
    assert set(summary) == {"runs", "mean"}
    run = summary["runs"][0]
    assert set(run) == {
        "workload",
        "policy",
        "seed",
        "unallocated_pct",
        "pods",
        "failed_pods",
        "seconds",
    }
    assert (run["workload"], run["policy"], run["seed"], run["failed_pods"]) == (
        "default",
        "fgd",
        42,
        7,
    )
    assert list(run["unallocated_pct"]) == ["90", "95", "100", "110", "120", "130"]
    assert run["unallocated_pct"]["130"] == pytest.approx(4.0)
    assert list(summary["mean"]) == ["fgd", "bestfit"]
    assert summary["mean"]["fgd"]["100"] == pytest.approx(5.0)
    json.dumps(summary, allow_nan=False)


def test_outputs_are_written(tmp_path: Path) -> None:
    written = report.write_outputs(tmp_path / "out", RESULTS, "title")
    names = [p.name for p in written]
    assert names == ["curves.csv", "summary.json", "unallocated.png"]
    with (tmp_path / "out" / "curves.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 * 131
    assert list(rows[0]) == [
        "workload",
        "policy",
        "seed",
        "arrived_pct",
        "unalloc_pct",
        "frag_pct",
        "frag_ratio",
    ]
    at_130 = rows[130]
    assert (at_130["policy"], at_130["seed"], at_130["arrived_pct"]) == ("fgd", "42", "130")
    assert float(at_130["unalloc_pct"]) == pytest.approx(4.0)
    assert float(at_130["frag_ratio"]) == pytest.approx(0.5)
    png = (tmp_path / "out" / "unallocated.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == report.summary(RESULTS)


def test_unwritable_out_dir_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write results"):
        report.write_outputs(blocker / "out", RESULTS, "title")


PUBLISHED = (
    "workload,sc_policy,arrived_pct,unalloc_gpu_pct_mean,unalloc_gpu_pct_sd,n_seeds\n"
    "openb_pod_list_default,06-FGD,100,4.773,0.106,10\n"
    "openb_pod_list_default,05-BestFit,100,7.138,0.144,10\n"
    "openb_pod_list_other,06-FGD,100,9.0,0.1,10\n"
)


def test_published_csv_maps_policy_names(tmp_path: Path) -> None:
    path = tmp_path / "published.csv"
    path.write_text(PUBLISHED)
    points = report.load_published(path, "default")
    assert set(points) == {("fgd", 100), ("bestfit", 100)}
    assert points[("fgd", 100)] == report.PublishedPoint(4.773, 0.106, 10)


def test_comparison_rows_hold_ours_published_and_delta(tmp_path: Path) -> None:
    path = tmp_path / "published.csv"
    path.write_text(PUBLISHED)
    rows = report.compare(RESULTS, report.load_published(path, "default"))
    assert len(rows) == 2 * 6
    fgd_100 = next(r for r in rows if (r.policy, r.arrived_pct) == ("fgd", 100))
    assert fgd_100.ours_mean == pytest.approx(5.0)
    assert fgd_100.ours_sd == pytest.approx(math.sqrt(2))
    assert fgd_100.delta == pytest.approx(5.0 - 4.773)
    fgd_90 = next(r for r in rows if (r.policy, r.arrived_pct) == ("fgd", 90))
    assert math.isnan(fgd_90.published_mean) and math.isnan(fgd_90.delta)
    report.write_comparison_csv(tmp_path / "cmp.csv", rows)
    lines = (tmp_path / "cmp.csv").read_text().splitlines()
    assert (
        lines[0] == "policy,arrived_pct,ours_mean,ours_sd,seeds,published_mean,published_sd,delta"
    )
    assert "fgd,100,5.0000,1.4142,2,4.7730,0.1060,0.2270" in lines


def test_malformed_published_csv_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "published.csv"
    path.write_text(PUBLISHED + "openb_pod_list_default,06-FGD,110,abc,0.1,10\n")
    with pytest.raises(ConfigError, match=r"published.csv:5: column unalloc_gpu_pct_mean: 'abc'"):
        report.load_published(path, "default")
    path.write_text("workload,policy\n")
    with pytest.raises(ConfigError, match="missing column"):
        report.load_published(path, "default")
    with pytest.raises(ConfigError, match="cannot read"):
        report.load_published(tmp_path / "absent.csv", "default")


def test_every_policy_has_its_own_fixed_colour_and_line() -> None:
    from gpupool.scheduler import POLICY_NAMES
    from gpupool.sim.report import _style

    styles = [_style(name) for name in POLICY_NAMES]
    assert len(set(styles)) == len(POLICY_NAMES)
    assert all(colour != "#000000" for colour, _ in styles), "black is the ideal line's"
