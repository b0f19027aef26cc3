"""The daemon's live target workload: learnt from submissions, shown by GET /v1/node and
`gpupool gpus`, kept in
the store across a kill -9, and used by the default `gpupool` policy to keep whole GPUs whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.agent.daemon_support import Daemon, cli

from gpupool.agent.jobs import JobSpec
from gpupool.agent.store import Store
from gpupool.agent.target import SETTING, LiveTarget
from gpupool.cli.gpus_view import placement_lines
from gpupool.core.errors import DaemonError
from gpupool.scheduler.recent import moved
from gpupool.scheduler.workload import PRIOR, TargetWorkload


def test_submissions_shape_the_target_which_survives_kill_9(daemon: Daemon) -> None:
    first = daemon.call("GET", "/v1/node")
    assert first["policy"] == "gpupool"
    assert [s["gpu_milli"] for s in first["target_workload"]] == [
        spec.gpu_milli for spec in PRIOR.specs
    ]
    # the prior's quarter and half GPU, priced as they pack (four and two to a GPU)
    assert [s.get("gpu_value") for s in first["target_workload"]] == [0.25, 0.5, None]
    for _ in range(30):
        job = daemon.submit(["true"], gpus=2, compute=100)
        daemon.wait(job)
    learnt = daemon.call("GET", "/v1/node")["target_workload"]
    assert learnt[0]["gpus"] == 2 and learnt[0]["gpu_milli"] == 1000
    assert learnt[0]["probability"] > 0.5
    shown = cli("gpus", "--node-dir", str(daemon.node_dir), url=daemon.url, check=True).stdout
    assert "Placement (node daemon): policy gpupool" in shown and "2 GPU x 100%" in shown
    daemon.kill()
    daemon.start()
    assert daemon.call("GET", "/v1/node")["target_workload"] == learnt


def test_gpus_without_a_driver_shows_the_daemons_simulated_node(daemon: Daemon) -> None:
    assert daemon.call("GET", "/v1/node")["node_dir"] == str(daemon.node_dir)
    env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_SIM_NODE"}
    shown = subprocess.run(
        [sys.executable, "-m", "gpupool", "gpus"],
        capture_output=True,
        text=True,
        env=dict(env, GPUPOOL_URL=daemon.url),
        timeout=60,
    )
    if shown.stdout.startswith("NVIDIA driver "):
        pytest.skip("this machine has an NVIDIA driver: `gpupool gpus` shows its GPUs")
    assert shown.returncode == 0, shown.stderr
    # (the header wraps a long path: compared without the whitespace)
    assert "".join(shown.stdout.split()).startswith(f"simulatednode{daemon.node_dir}(simulated")
    # no daemon there: the one line that says how to name a simulated node
    nowhere = dict(env, GPUPOOL_URL=f"unix://{daemon.root / 'none.sock'}")
    alone = subprocess.run(
        [sys.executable, "-m", "gpupool", "gpus"], capture_output=True, text=True, env=nowhere
    )
    assert alone.returncode == 4 and "--node-dir DIR" in alone.stderr, alone.stderr


def test_gpupool_puts_a_small_share_beside_another_not_on_an_idle_gpu(daemon: Daemon) -> None:
    # the target (whole GPUs, learnt) wants a GPU left whole: the second share joins the first
    for _ in range(10):
        daemon.wait(daemon.submit(["true"], gpus=1, compute=100))
    first = daemon.submit(["sleep", "30"], compute=30)
    second = daemon.submit(["sleep", "30"], compute=30)
    gpus = [daemon.wait(j, ("running",))["gpus"] for j in (first, second)]
    assert gpus[0] == gpus[1]
    for job in (first, second):
        daemon.call("POST", f"/v1/jobs/{job}/cancel", json={})


def test_a_submit_the_store_refuses_leaves_the_window_as_it_was(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    target = LiveTarget(store)
    before = target.describe()
    spec = JobSpec(("true",), gpus=2)
    with pytest.raises(DaemonError), target.submitting([spec.request()]) as window:
        store.add(spec, None, "alice", settings=window)  # type: ignore[arg-type]
    assert target.describe() == before and store.setting(SETTING) is None
    with target.submitting([spec.request()]) as window:
        store.add(spec, 1000, "alice", settings=window)
    assert LiveTarget(store).describe() == target.describe() != before


def test_gpus_tells_shapes_alike_in_compute_apart_by_their_memory() -> None:
    def shape(**memory: object) -> dict[str, object]:
        return {"gpus": 1, "gpu_milli": 500, "gpu_models": [], "probability": 0.25, **memory}

    shapes = [
        shape(memory=16 << 30),
        shape(memory_share=0.4),
        shape(proportional=True, gpu_value=0.5),
        shape(gpu_models=["A100-40GB"]),
    ]
    assert placement_lines({"policy": "gpupool", "target_workload": shapes}) == [
        "Placement (node daemon): policy gpupool",
        "target workload (recent shapes):",
        "  1 GPU x 50%, 16GiB: 25.0%",
        "  1 GPU x 50%, 40% of memory: 25.0%",
        "  1 GPU x 50%, memory in proportion: 25.0%, worth 0.50 GPU",
        "  1 GPU x 50% of A100-40GB: 25.0%",
    ]


def test_the_daemon_places_by_a_new_target_once_the_window_moved(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    target = LiveTarget(store)
    placing = target.target()
    spec = JobSpec(("true",), gpus=1, compute=300)

    def submit() -> None:
        with target.submitting([spec.request()]) as window:
            store.add(spec, 1000, "alice", settings=window)

    submit()  # one shape in a window worth 20 submissions: no probability moved by 0.05
    assert target.target() is placing
    while target.target() is placing:
        submit()
    taken = target.target()
    assert any(s.gpu_milli == 300 for s in taken.specs)
    assert not moved(taken, store_window(store))  # what it places by is the window's, close


def store_window(store: Store) -> TargetWorkload:
    """The target of the window the store keeps (what a restarted daemon starts from)."""
    return LiveTarget(store).target()
