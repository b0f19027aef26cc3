"""bench/gpu/modes.py's dry run on a simulated node: the MPS GPU check is never run blind.

Both of its tables: the 30 % + 70 % pair, and the high request loop beside a low job."""

from __future__ import annotations

from pathlib import Path

from tests.gpu_dry_run import dry_run


def test_the_mps_gpu_check_passes_on_a_simulated_node(tmp_path: Path) -> None:
    args = ("--simulate", "1xA30", "--seconds", "1", "--memory-gib", "2")
    report = dry_run("modes.py", tmp_path, *args, short_tmp=True)
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    pair = [row for row in rows if row.startswith(("| 30 %", "| 70 %"))]
    assert len(pair) == 2
    assert all("| yes | OutOfMemoryError |" in row for row in pair), rows
    # the priority pair on the twin: the high request loop keeps its latency beside the low job,
    # and loses it beside the same job at high priority
    steps = {row.split(" | ")[0][2:]: row.split(" | ")[1:] for row in rows}
    # (by the request rate: a 1 s run's p50 moves with the machine's load, the rate much less;
    # beside the low job it is about what it is alone, beside a high one a fiftieth of it)
    alone_rate = float(steps["high alone"][0])
    assert float(steps["high beside low"][0]) > 0.6 * alone_rate, rows
    no_priorities = steps["high beside the same job at high (no priorities)"]
    assert float(no_priorities[0]) < 0.3 * alone_rate, rows
