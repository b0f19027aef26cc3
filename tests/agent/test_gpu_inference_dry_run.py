"""bench/gpu/inference_pool.py's dry run on a simulated node: the GPU check is never run blind."""

from __future__ import annotations

from pathlib import Path

from tests.gpu_dry_run import dry_run


def test_the_inference_gpu_check_runs_on_a_simulated_node(tmp_path: Path) -> None:
    text = dry_run("inference_pool.py", tmp_path, "--simulate", "--seconds", "1", short_tmp=True)
    # both modes, each with the four services on one GPU
    assert text.count("GPUs used pooled: [0] (one per service: 4)") == 2
    assert "## Mode shim" in text and "## Mode mps" in text
    rows = [line for line in text.splitlines() if line.startswith(("| bert-", "| gpt2-"))]
    assert len(rows) == 8 and all("'200'" in row and "'5" not in row for row in rows), rows


def test_the_swap_gpu_check_runs_on_a_simulated_node(tmp_path: Path) -> None:
    text = dry_run("inference_pool.py", tmp_path, "--simulate", "--swap", short_tmp=True)
    assert "## Swap: two GPT-2 services of 60 % of the GPU each" in text, text
    cells = {
        line.split(" | ")[0].strip("| "): line.split(" | ")[1].strip(" |")
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| first", "|---"))
    }
    assert list(cells) == [
        "cold start (create to first token)",
        "resident",
        "parked, swapped in for the request",
        "of it, the swap in (wake to ready)",
    ], text
    assert all(float(value) > 0 for value in cells.values()), cells
