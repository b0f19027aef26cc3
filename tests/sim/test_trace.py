"""The trace loader: good files become NodeSpec/Request lists; bad ones name file, line, column."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidRequest, TraceFormatError
from gpupool.core.units import MiB
from gpupool.sim import trace
from gpupool.sim.trace import TRACE_URL

TraceWriter = Callable[..., Path]


def test_nodes_load_with_units(write_trace: TraceWriter) -> None:
    nodes = trace.load_nodes(write_trace())
    assert [n.name for n in nodes] == ["n0", "n1"]
    assert nodes[1].cpu == 96000
    assert nodes[1].host_memory == 786432 * MiB
    assert (nodes[1].gpu_count, nodes[1].gpu_model) == (8, "G2")
    assert trace.cluster_gpu_milli(nodes) == 10_000


def test_pods_load_fractional_whole_multi_and_cpu_only(write_trace: TraceWriter) -> None:
    pods = {p.name: p for p in trace.load_workload(write_trace(), "default")}
    assert (pods["p2"].gpus, pods["p2"].compute, pods["p2"].is_fractional) == (1, 220, True)
    assert (pods["p0"].gpus, pods["p0"].compute, pods["p0"].gpu_models) == (1, 1000, ())
    assert pods["p1"].gpu_models == ("V100M16", "V100M32")
    assert pods["p1"].total_gpu_milli == 8000
    assert (pods["p3"].gpus, pods["p3"].total_gpu_milli) == (0, 0)
    assert pods["p3"].host_memory == 30517 * MiB


def test_files_directly_in_the_directory_work(write_trace: TraceWriter) -> None:
    csv_folder = write_trace() / "csv"
    assert len(trace.load_nodes(csv_folder)) == 2
    assert trace.workload_names(csv_folder) == ["default"]


def test_multigpu_files_with_five_columns_load(write_trace: TraceWriter, tmp_path: Path) -> None:
    folder = write_trace() / "csv"
    (folder / "openb_pod_list_multigpu20.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,2,1000\n"
    )
    (pod,) = trace.load_workload(folder, "multigpu20")
    assert (pod.gpus, pod.total_gpu_milli, pod.gpu_models) == (2, 2000, ())


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("q,4000,15258,x,220,,BE,Running,0,10,0\n", "column num_gpu: 'x' is not an integer"),
        ("q,4.5,15258,1,220,,BE,Running,0,10,0\n", "column cpu_milli: '4.5' is not an integer"),
        ("q,4000,-1,1,220,,BE,Running,0,10,0\n", "column memory_mib: -1 is negative"),
        ("q,4000,15258,1,1200,,BE,Running,0,10,0\n", "column gpu_milli: 1200 is outside"),
        ("q,4000,15258,2,500,,BE,Running,0,10,0\n", "column gpu_milli: 500 is a fractional"),
        ("q,4000,15258\n", "expected 11 fields, found 3"),
    ],
)
def test_malformed_pod_row_names_file_line_and_column(
    write_trace: TraceWriter, row: str, message: str
) -> None:
    folder = write_trace(extra_pods=row)
    with pytest.raises(TraceFormatError) as caught:
        trace.load_workload(folder, "default")
    # header is line 1, the four good rows lines 2..5: the bad row is line 6
    assert str(caught.value).startswith("openb_pod_list_default.csv:6: ")
    assert message in str(caught.value)


def test_malformed_node_row_names_the_column(write_trace: TraceWriter) -> None:
    folder = write_trace(nodes="n0,64000,262144,two,P100\n")
    with pytest.raises(TraceFormatError, match=r"gpu_node.csv:2: column gpu: 'two'"):
        trace.load_nodes(folder)


def test_missing_column_is_reported(write_trace: TraceWriter) -> None:
    folder = write_trace()
    (folder / "csv" / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,gpu\nn,1,1\n")
    with pytest.raises(TraceFormatError, match=r"missing column.*memory_mib"):
        trace.load_nodes(folder)


def test_missing_directory_says_where_to_download(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as caught:
        trace.load_nodes(tmp_path / "nowhere")
    assert "nowhere" in str(caught.value)
    assert TRACE_URL in str(caught.value)


def test_missing_node_file_says_where_to_download(write_trace: TraceWriter) -> None:
    folder = write_trace()
    (folder / "csv" / "openb_node_list_gpu_node.csv").unlink()
    with pytest.raises(TraceFormatError, match="cluster-trace-gpu-v2023"):
        trace.load_nodes(folder)


def test_unknown_workload_lists_the_available_ones(write_trace: TraceWriter) -> None:
    folder = write_trace()
    write_trace(workload="gpushare40")
    with pytest.raises(InvalidRequest, match="'nope'; available: default, gpushare40"):
        trace.load_workload(folder, "nope")


def test_default_trace_dir_is_found_beside_the_current_directory(tmp_path: Path) -> None:
    beside = tmp_path / "shared" / "traces" / "alibaba-gpu-v2023"
    beside.mkdir(parents=True)
    checkout = tmp_path / "repo"
    checkout.mkdir()
    assert trace.default_trace_dir(checkout) == beside.resolve()


def test_header_only_files_are_errors(write_trace: TraceWriter) -> None:
    folder = write_trace(pods="")
    with pytest.raises(TraceFormatError, match="no pods"):
        trace.load_workload(folder, "default")
