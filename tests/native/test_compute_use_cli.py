"""`gpupool gpus` and `gpupool exec` show each share's compute use against its share: two shares
busy at once through `gpupool exec` on one simulated GPU, read by `gpupool gpus` meanwhile."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shim_support import PROGS, compile_prog

SECONDS = 5.0


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


def gpupool(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpupool", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.serial
def test_gpus_and_exec_show_each_busy_share_against_its_share(client: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    node = tmp_path / "node"
    made = gpupool("exec", "--simulate", "1xH100", "--node-dir", str(node), "--", "true", env=env)
    assert made.wait(timeout=60) == 0
    shares = [("30", "high"), ("70", "low")]
    runs = [
        gpupool(
            *("exec", "--node-dir", str(node), "--compute", percent, "--priority", priority),
            *("--", str(client), "run", str(SECONDS), "kernel"),
            env=env,
        )
        for percent, priority in shares
    ]
    time.sleep(1.5)  # both busy
    # three readings, each of `gpus`' 0.5 s window, judged by their median: one such window on
    # 2 busy cores moves by more than the tolerance now and then
    docs = [
        json.loads(gpupool("gpus", "--node-dir", str(node), "--json", env=env).communicate(60)[0])
        for _ in range(3)
    ]
    table = gpupool("gpus", "--node-dir", str(node), env=env)
    text = table.communicate(timeout=60)[0]
    outputs = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    got = {row["percent"]: row for row in docs[0]["compute_shares"]}
    assert sorted(got) == [30, 70], docs[0]["compute_shares"]
    assert got[30]["priority"] == "high" and got[70]["priority"] == "low"
    for percent in (30, 70):
        used = [
            row["used_percent"]
            for doc in docs
            for row in doc["compute_shares"]
            if row["percent"] == percent
        ]
        assert len(used) == 3 and abs(statistics.median(used) - percent) <= 8, docs
    assert "Compute shares" in text and "30% cap" in text and "70% cap" in text, text
    for (percent, priority), (stdout, stderr) in zip(shares, outputs, strict=True):
        assert stdout.startswith("run "), stdout  # the command's own output, alone
        (line,) = [x for x in stderr.splitlines() if x.startswith("gpupool: compute use")]
        prefix = "gpupool: compute use on GPU 0: "
        suffix = f" s (share {percent}% cap, priority {priority})"
        assert line.startswith(prefix), line
        # the run's wall time includes the process's start: a little under its share
        used = float(line[len(prefix) :].split("%")[0])
        assert int(percent) * 0.75 <= used <= int(percent) + 5, line
        assert "% of the GPU over " in line and line.endswith(suffix), line


def test_gpus_without_running_shares_shows_no_compute_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    node = tmp_path / "node"
    shown = gpupool("gpus", "--simulate", "1xH100", "--node-dir", str(node), "--json", env=env)
    assert json.loads(shown.communicate(timeout=60)[0])["compute_shares"] == []
