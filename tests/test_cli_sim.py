"""`gpupool sim` and `gpupool demo` through the real CLI: JSON schema, outputs, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def gpupool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpupool: error: ")
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """Eight nodes and forty pods: enough for a real replay, small enough to be instant."""
    folder = tmp_path / "trace" / "csv"
    folder.mkdir(parents=True)
    nodes = "".join(f"n{i},96000,786432,{(2, 4, 8)[i % 3]},G{i % 2}\n" for i in range(8))
    pods = "".join(
        f"p{i:02d},4000,15258,{1 if i % 5 else 2},{100 * (i % 9 + 1) if i % 5 else 1000},\n"
        for i in range(40)
    )
    (folder / "openb_node_list_gpu_node.csv").write_text(NODE_HEADER + nodes)
    (folder / "openb_pod_list_default.csv").write_text(POD_HEADER + pods)
    (folder / "openb_pod_list_gpushare40.csv").write_text(POD_HEADER + pods)
    return tmp_path / "trace"


def test_json_prints_exactly_the_summary_object(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["sim", "--synthetic", "--policy", "fgd,bestfit", "--seeds", "1-2", "--json"]
    result = gpupool(*args, "--out", str(out), "--jobs", "2")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(summary) == {"runs", "mean"}
    assert [(r["policy"], r["seed"]) for r in summary["runs"]] == [
        ("fgd", 1),
        ("fgd", 2),
        ("bestfit", 1),
        ("bestfit", 2),
    ]
    for run in summary["runs"]:
        assert set(run) == {
            "workload",
            "policy",
            "seed",
            "unallocated_pct",
            "pods",
            "failed_pods",
            "seconds",
        }
        assert run["workload"] == "synthetic"
        assert list(run["unallocated_pct"]) == ["90", "95", "100", "110", "120", "130"]
        assert all(0 <= v <= 100 for v in run["unallocated_pct"].values() if v is not None)
        assert run["pods"] > run["failed_pods"] >= 0
    assert list(summary["mean"]) == ["fgd", "bestfit"]
    runs_fgd = [r["unallocated_pct"]["100"] for r in summary["runs"][:2]]
    assert summary["mean"]["fgd"]["100"] == pytest.approx(sum(runs_fgd) / 2, abs=2e-3)
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.csv",
        "summary.json",
        "unallocated.png",
    ]
    assert result.stderr == "", "no progress bar on a non-terminal with --json"


def test_table_output_and_published_comparison(tmp_path: Path) -> None:
    published = tmp_path / "published.csv"
    published.write_text(
        "workload,sc_policy,arrived_pct,unalloc_gpu_pct_mean,unalloc_gpu_pct_sd,n_seeds\n"
        "synthetic,06-FGD,100,1.5,0.1,10\n"
    )
    result = gpupool("sim", "--synthetic", "--policy", "fgd,random", "--compare", str(published))
    assert result.returncode == 0, result.stderr
    assert "unallocated GPU %" in result.stdout
    assert "1.50 ± 0.10" in result.stdout
    assert "no published values in published.csv for: random" in result.stdout


def test_sim_on_a_trace_directory(small_trace: Path) -> None:
    args = ["sim", "--trace-dir", str(small_trace), "--workload", "gpushare40"]
    result = gpupool(*args, "--policy", "all", "--json", "--jobs", "1")
    assert result.returncode == 0, result.stderr
    policies = [run["policy"] for run in json.loads(result.stdout)["runs"]]
    assert "fgd" in policies and "gpupool" in policies and "random" in policies


def test_unknown_policy_lists_the_valid_names() -> None:
    result = gpupool("sim", "--synthetic", "--policy", "fgd,nope")
    assert_one_line_error(result, "unknown policy 'nope'", "fgd", "bestfit", "gpupool")
    assert result.returncode == 2


@pytest.mark.parametrize(
    ("seeds", "message"),
    [("51-42", "invalid seed range '51-42'"), ("x", "invalid seed range 'x'"), ("-3", "-3")],
)
def test_bad_seed_ranges(seeds: str, message: str) -> None:
    assert_one_line_error(gpupool("sim", "--synthetic", "--seeds", seeds), message)


def test_unknown_workload_lists_the_available_ones(small_trace: Path) -> None:
    result = gpupool("sim", "--trace-dir", str(small_trace), "--workload", "nope")
    assert_one_line_error(result, "unknown workload 'nope'", "available: default, gpushare40")


def test_malformed_trace_row_names_file_line_and_column(small_trace: Path) -> None:
    path = small_trace / "csv" / "openb_pod_list_default.csv"
    path.write_text(path.read_text() + "bad,4000,15258,x,100,\n")
    result = gpupool("sim", "--trace-dir", str(small_trace), "--json")
    assert_one_line_error(
        result, "openb_pod_list_default.csv:42: column num_gpu: 'x' is not an integer"
    )
    assert result.stdout == ""


def test_synthetic_and_a_trace_dir_exclude_each_other(small_trace: Path) -> None:
    result = gpupool("sim", "--synthetic", "--trace-dir", str(small_trace))
    assert_one_line_error(result, "--synthetic and --trace-dir exclude each other")


def test_missing_trace_says_where_to_download(tmp_path: Path) -> None:
    result = gpupool("sim", "--trace-dir", str(tmp_path / "none"))
    assert_one_line_error(result, "not found", "github.com/alibaba/clusterdata")


def test_demo_without_a_trace_says_so_and_writes_the_plot(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["demo", "--trace-dir", str(tmp_path / "absent"), "--seeds", "1", "--out", str(out)]
    result = gpupool(*args)
    assert result.returncode == 0, result.stderr
    assert "trace not found at" in result.stderr
    assert "running on a synthetic cluster" in result.stderr
    for policy in ("random", "bestfit", "fgd", "gpupool"):
        assert policy in result.stdout
    assert f"wrote {out / 'unallocated.png'}" in result.stdout.replace("\n", "")
    assert (out / "unallocated.png").stat().st_size > 20_000


def test_a_trace_that_is_not_utf8_is_one_line_naming_the_file(small_trace: Path) -> None:
    pods = small_trace / "csv" / "openb_pod_list_default.csv"
    pods.write_bytes(pods.read_bytes() + b"p\xe9,4000,15258,1,100,\n")
    result = gpupool("sim", "--trace-dir", str(small_trace), "--policy", "fgd", "--json")
    assert_one_line_error(result, "openb_pod_list_default.csv", "not UTF-8")
    assert result.returncode == 2


def test_a_compare_csv_that_is_not_utf8_is_one_line_naming_the_file(
    small_trace: Path, tmp_path: Path
) -> None:
    published = tmp_path / "published.csv"
    published.write_bytes(b"workload,policy\n\xff\xfe\n")
    args = ["--policy", "fgd", "--compare", str(published)]
    result = gpupool("sim", "--trace-dir", str(small_trace), *args)
    assert_one_line_error(result, "published.csv:2", "not UTF-8")


def test_pods_no_node_can_hold_are_a_counted_warning(small_trace: Path) -> None:
    pods = small_trace / "csv" / "openb_pod_list_default.csv"
    never = "x0,4000,15258,1,500,V100M16\nx1,4000,15258,1,500,A100|H100\nx2,4000,15258,16,1000,\n"
    pods.write_text(pods.read_text() + never)
    result = gpupool("sim", "--trace-dir", str(small_trace), "--policy", "fgd", "--json")
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.splitlines()
    assert warnings == [
        "gpupool: warning: openb_pod_list_default.csv: 2 pod(s) ask only for GPU models no node "
        "has (first: x0, gpu_spec V100M16); they are never placed",
        "gpupool: warning: openb_pod_list_default.csv: 1 pod(s) ask for more GPUs than the "
        "largest node has (8; first: x2, num_gpu 16); they are never placed",
    ]
    assert json.loads(result.stdout)["runs"][0]["failed_pods"] > 0


def test_a_plot_without_matplotlib_is_one_line_with_the_extra_to_install(tmp_path: Path) -> None:
    """matplotlib is the `plot` extra: without it, `--out` is refused before any replay runs."""
    hide = "import sys; sys.modules['matplotlib'] = None; from gpupool.cli.main import main; main()"
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", hide, "sim", "--synthetic", "--policy", "fgd", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert_one_line_error(result, "pip install 'gpupool[plot]'")
    assert not out.exists()
