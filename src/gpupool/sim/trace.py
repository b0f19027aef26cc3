"""Load the Alibaba GPU trace (cluster-trace-gpu-v2023, "openb") into NodeSpec and Request lists."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from gpupool.core.errors import InvalidRequest, TraceFormatError
from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import MILLI_PER_GPU, MiB

TRACE_URL = "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023"
NODE_FILE = "openb_node_list_gpu_node.csv"
WORKLOAD_PREFIX = "openb_pod_list_"
#: where the trace sits relative to a checkout (or to the current directory)
DEFAULT_TRACE_RELPATH = Path("..") / "shared" / "traces" / "alibaba-gpu-v2023"

_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def _repo_root() -> Path:
    # src/gpupool/sim/trace.py -> the checkout that holds src/
    return Path(__file__).resolve().parents[3]


def find_beside(relpath: Path, cwd: Path | None = None) -> Path | None:
    """`relpath` resolved against the current directory, else against the checkout; None if
    neither exists (shared data such as the trace sits beside the repository, never in it)."""
    for base in (cwd or Path.cwd(), _repo_root()):
        candidate = (base / relpath).resolve()
        if candidate.exists():
            return candidate
    return None


def default_trace_dir(cwd: Path | None = None) -> Path | None:
    """The trace beside the current directory, else beside the repository; None if neither."""
    found = find_beside(DEFAULT_TRACE_RELPATH, cwd)
    return found if found is not None and found.is_dir() else None


def _missing(what: str) -> TraceFormatError:
    return TraceFormatError(
        f"{what} not found; download the public trace (its csv/ folder) from {TRACE_URL}"
    )


def csv_dir(trace_dir: Path) -> Path:
    """The folder that holds the CSV files: `trace_dir/csv` when present, else `trace_dir`."""
    if not trace_dir.is_dir():
        raise _missing(f"trace directory {str(trace_dir)!r}")
    nested = trace_dir / "csv"
    return nested if nested.is_dir() else trace_dir


def workload_names(trace_dir: Path) -> list[str]:
    """Workload names available in the trace (`default`, `gpushare40`, ...), sorted."""
    return sorted(
        path.name[len(WORKLOAD_PREFIX) : -len(".csv")]
        for path in csv_dir(trace_dir).glob(f"{WORKLOAD_PREFIX}*.csv")
    )


def workload_path(trace_dir: Path, name: str) -> Path:
    """The CSV file of workload `name`; an unknown name lists the available ones."""
    folder = csv_dir(trace_dir)
    path = folder / f"{WORKLOAD_PREFIX}{name}.csv"
    if path.is_file():
        return path
    available = workload_names(trace_dir)
    if not available:
        raise _missing(f"workload files ({WORKLOAD_PREFIX}*.csv) in {str(folder)!r}")
    raise InvalidRequest(f"unknown workload {name!r}; available: {', '.join(available)}")


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row; a missing column or short row is an error."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as err:
        raise _missing(f"trace file {str(path)!r}") from err
    with handle:
        try:
            yield from _read_rows(path, handle, columns)
        except UnicodeDecodeError as err:
            # decoding runs a buffer ahead of the csv reader: name the file, not a line
            raise TraceFormatError(f"{path.name}: not UTF-8 text ({err.reason})") from None


def _read_rows(
    path: Path, handle: TextIO, columns: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        raise TraceFormatError(f"{path.name}:1: empty file, expected a header row")
    header = [column.strip() for column in header]
    missing = [column for column in columns if column not in header]
    if missing:
        raise TraceFormatError(f"{path.name}:1: missing column(s) {', '.join(missing)}")
    for values in reader:
        line = reader.line_num
        if not values or all(not value.strip() for value in values):
            continue
        if len(values) < len(header):
            raise TraceFormatError(
                f"{path.name}:{line}: expected {len(header)} fields, found {len(values)}"
            )
        yield line, dict(zip(header, values, strict=False))


def _integer(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(
            f"{path.name}:{line}: column {column}: {text!r} is not an integer"
        ) from None
    if value < 0:
        raise TraceFormatError(f"{path.name}:{line}: column {column}: {value} is negative")
    return value


def load_nodes(trace_dir: Path) -> list[NodeSpec]:
    """The GPU nodes of the trace, in file order."""
    path = csv_dir(trace_dir) / NODE_FILE
    nodes: list[NodeSpec] = []
    for line, row in _rows(path, _NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceFormatError(f"{path.name}:{line}: column sn: empty node name")
        nodes.append(
            NodeSpec(
                name=name,
                cpu=_integer(path, line, row, "cpu_milli"),
                host_memory=_integer(path, line, row, "memory_mib") * MiB,
                gpu_count=_integer(path, line, row, "gpu"),
                gpu_model=row["model"].strip(),
            )
        )
    if not nodes:
        raise TraceFormatError(f"{path.name}: no nodes")
    return nodes


def _pod(path: Path, line: int, row: dict[str, str]) -> Request:
    name = row["name"].strip()
    if not name:
        raise TraceFormatError(f"{path.name}:{line}: column name: empty pod name")
    gpus = _integer(path, line, row, "num_gpu")
    milli = _integer(path, line, row, "gpu_milli")
    if gpus > 0 and not 0 < milli <= MILLI_PER_GPU:
        raise TraceFormatError(
            f"{path.name}:{line}: column gpu_milli: {milli} is outside 1..{MILLI_PER_GPU}"
        )
    if gpus > 1 and milli < MILLI_PER_GPU:
        raise TraceFormatError(
            f"{path.name}:{line}: column gpu_milli: {milli} is a fractional share "
            f"but num_gpu is {gpus} (a share below {MILLI_PER_GPU} needs num_gpu 1)"
        )
    spec = row.get("gpu_spec", "").strip()
    # Duplicates such as "V100M16|V100M32|V100M32" are kept: FGD groups pods by the spec text.
    models = tuple(model.strip() for model in spec.split("|") if model.strip()) if spec else ()
    return Request(
        name=name,
        cpu=_integer(path, line, row, "cpu_milli"),
        host_memory=_integer(path, line, row, "memory_mib") * MiB,
        gpus=gpus,
        compute=milli if gpus > 0 else MILLI_PER_GPU,
        gpu_models=models,
    )


def load_workload(trace_dir: Path, name: str) -> list[Request]:
    """The pods of `openb_pod_list_NAME.csv`, in file order."""
    path = workload_path(trace_dir, name)
    pods = [_pod(path, line, row) for line, row in _rows(path, _POD_COLUMNS)]
    if not pods:
        raise TraceFormatError(f"{path.name}: no pods")
    return pods


def never_placed(nodes: list[NodeSpec], pods: list[Request], source: str) -> list[str]:
    """One warning line per kind of pod that no node of the cluster can ever hold: GPU models no
    node has, or more GPUs than the largest node. The replay keeps them (they count as arrived
    and never allocated, as in the paper's procedure); the warning says how many there are."""
    models = {node.gpu_model for node in nodes}
    largest = max((node.gpu_count for node in nodes), default=0)
    unknown = [p for p in pods if p.gpus and p.gpu_models and not models & set(p.gpu_models)]
    too_big = [p for p in pods if p.gpus > largest]
    lines = []
    if unknown:
        first = unknown[0]
        lines.append(
            f"{source}: {len(unknown)} pod(s) ask only for GPU models no node has "
            f"(first: {first.name}, gpu_spec {'|'.join(first.gpu_models)}); they are never placed"
        )
    if too_big:
        first = too_big[0]
        lines.append(
            f"{source}: {len(too_big)} pod(s) ask for more GPUs than the largest node has "
            f"({largest}; first: {first.name}, num_gpu {first.gpus}); they are never placed"
        )
    return lines


def cluster_gpu_milli(nodes: list[NodeSpec]) -> int:
    """GPU milli of the whole cluster (6212 * 1000 for the trace's GPU nodes)."""
    return sum(node.gpu_count for node in nodes) * MILLI_PER_GPU
