"""MIG jobs through a real daemon on a simulated node: instances found free or created where the
planner says, used by several jobs at once, destroyed after, and never orphaned by a kill -9."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import CUDA_JOB, Daemon, cli

from gpupool.agent.jobs import JobSpec
from gpupool.agent.store import Store
from gpupool.core.resources import Mode
from gpupool.devices.sim.node import SimNode
from gpupool.mig import catalog

H100 = catalog.get_model("H100")
#: GPU 0 an H100 in MIG mode with no instance, GPU 1 an H100 with a 3g.40gb an admin made,
#: GPU 2 an A100-40GB with MIG off
SPEC = """gpus:
  - model: H100
    mig: true
  - model: H100
    mig: [3g.40gb]
  - model: A100-40GB
"""


def start_daemon(root: Path, spec: str, *extra: str) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    (root / "spec.yaml").write_text(spec)
    return Daemon(root, str(root / "spec.yaml"), extra).start()


@pytest.fixture
def mig_daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path / "d", SPEC)
    yield running
    running.stop()
    _kill_jobs(running)


def instances(daemon: Daemon, gpu: int) -> list[dict[str, Any]]:
    """The GPU's instances as the simulated node holds them now."""
    data = json.loads((daemon.node_dir / "node.json").read_text())
    return list(data["gpus"][gpu]["instances"])


def instances_once_settled(daemon: Daemon, gpu: int) -> list[dict[str, Any]]:
    """The GPU's instances once the daemon has destroyed those of the jobs that ended: a job is
    reported ended first, its instance goes in the queue's next pass."""
    deadline = time.monotonic() + 10
    while (found := instances(daemon, gpu)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def job_on(daemon: Daemon, seconds: float, *args: str, **share: Any) -> int:
    return daemon.submit([sys.executable, CUDA_JOB, str(seconds), *args], **share)


def details(daemon: Daemon, job_id: int, kind: str) -> list[str]:
    return [e["detail"] for e in daemon.job(job_id)["events"] if e["kind"] == kind]


def waiting(daemon: Daemon, job_id: int) -> list[str]:
    """Why a queued job waits, once the queue has looked at it."""
    deadline = time.monotonic() + 30
    while not (why := daemon.job(job_id)["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(why)


def test_jobs_run_at_once_on_their_own_instances_which_go_after_them(mig_daemon: Daemon) -> None:
    # long enough to be running still when the slowest check below runs on a loaded machine
    small = job_on(mig_daemon, 8, "1000", mig_profile="1g.10gb")
    halves = job_on(mig_daemon, 3, "4000", "2000", mig_profile="1g.10gb", memory="50%")
    admin = job_on(mig_daemon, 8, "100", mode="mig", mig_profile="3g.40gb")
    shim = job_on(mig_daemon, 8, "100", compute=50)
    running = [mig_daemon.wait(j, ("running",)) for j in (small, admin, shim)]
    # two new 1g.10gb instances on GPU 0 (where none strands a slice), the admin's 3g.40gb
    # on GPU 1 found free, and the shim job on the one GPU not in MIG mode
    made = {i["uuid"]: i for i in instances(mig_daemon, 0)}
    assert running[0]["mig"].startswith("mig:1g.10gb@0/") and running[0]["mig_uuid"] in made
    assert running[1]["mig"] == "mig:3g.40gb@1/1" and running[1]["gpus"] == [1]
    assert running[2]["gpus"] == [2] and running[2]["mig"] is None
    assert details(mig_daemon, admin, "placed") == ["mig:3g.40gb@1/1 (free)"]
    gpus = cli("gpus", "--node-dir", str(mig_daemon.node_dir), url=mig_daemon.url, check=True)
    assert f"job {small} " in gpus.stdout and f"job {admin} " in gpus.stdout
    # a second shim job that needs all of a GPU waits for GPU 2, the one GPU it may use
    whole = job_on(mig_daemon, 0.1, "100")
    assert waiting(mig_daemon, whole)[-2:] == [
        "GPU 0: in MIG mode, for MIG jobs only",
        "GPU 1: in MIG mode, for MIG jobs only",
    ]
    ps = cli("ps", url=mig_daemon.url, check=True).stdout
    assert running[0]["mig"] in ps and "mig:3g.40gb@1/1" in ps
    # inside its instance the half share is half the instance: 4000 MiB held, 2000 more refused
    ended = mig_daemon.wait(halves)
    assert ended["exit_code"] == 2 and ended["oom"]
    assert ended["memory"] == H100.profile("1g.10gb").memory_bytes // 2
    logs = cli("logs", str(halves), url=mig_daemon.url, check=True).stdout
    assert "2000 MiB more: CUDA_ERROR_OUT_OF_MEMORY" in logs
    for job_id in (small, admin, shim, whole):
        assert mig_daemon.wait(job_id)["exit_code"] == 0
    assert instances_once_settled(mig_daemon, 0) == []  # what the daemon made went with the jobs
    assert [i["profile"] for i in instances(mig_daemon, 1)] == ["3g.40gb"]  # the admin's stays
    assert details(mig_daemon, small, "mig")[0].endswith("destroyed")


def test_a_queued_mig_job_says_which_gpu_cannot_take_its_profile(mig_daemon: Daemon) -> None:
    holder = job_on(mig_daemon, 8, "100", mig_profile="1g.10gb")  # holds GPU 0 past the checks
    mig_daemon.wait(holder, ("running",))
    whole = job_on(mig_daemon, 0.1, "100", mig_profile="7g.80gb")
    why = waiting(mig_daemon, whole)
    assert why[0].startswith("GPU 0: no free 7g.80gb instance, none can be added: ")
    assert why[1].startswith("GPU 1: no free 7g.80gb instance, none can be added: ")
    assert why[2] == "GPU 2: no 7g.80gb profile"
    assert "(7g.80gb)" in cli("ps", url=mig_daemon.url, check=True).stdout
    described = cli("describe", str(whole), url=mig_daemon.url, check=True).stdout
    assert "MIG:      7g.80gb instance: not placed yet" in described
    assert mig_daemon.wait(whole)["mig"].startswith("mig:7g.80gb@0/")  # once GPU 0 is empty
    assert instances_once_settled(mig_daemon, 0) == []


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["--mig-profile", "2g.99gb"],
            2,
            "unknown MIG profile '2g.99gb' for this node's GPUs; valid: H100-80GB: 1g.10gb, ",
        ),
        (
            ["--mig-profile", "1g.5gb"],
            3,
            "MIG profile 1g.5gb needs a GPU in MIG mode; GPU 2 could take it but MIG mode is "
            "off: an admin turns MIG mode on first, e.g. `sudo nvidia-smi -i 2 -mig 1`",
        ),
        (["--mode", "shim", "--mig-profile", "1g.10gb"], 2, "mode mig and --mig-profile go"),
        (["--mode", "mig"], 2, "mode mig and --mig-profile go together"),
        (["--mig-profile", "1g.10gb", "--gpus", "2"], 2, "runs on one MIG instance"),
    ],
)
def test_bad_mig_requests_are_one_line_and_nothing_is_stored(
    mig_daemon: Daemon, args: list[str], code: int, message: str
) -> None:
    result = cli("submit", *args, "--", "true", url=mig_daemon.url)
    assert (result.returncode, result.stdout) == (code, ""), result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert mig_daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"] == []
    assert instances(mig_daemon, 0) == []


def test_a_profile_that_fits_nowhere_is_refused(tmp_path: Path) -> None:
    full = "gpus:\n  - model: H100\n    mig: [3g.40gb, 3g.40gb]\n"
    daemon = start_daemon(tmp_path / "full", full)
    try:
        result = cli("submit", "--mig-profile", "1g.10gb", "--", "true", url=daemon.url)
        assert result.returncode == 3
        assert result.stderr.strip().endswith(
            "MIG profile 1g.10gb fits nowhere on this node: GPU 0: no valid start of 1g.10gb "
            "(0, 1, 2, 3, 4, 5, 6) is free next to 3g.40gb@0, 3g.40gb@4"
        )
    finally:
        daemon.stop()


def test_kill_9_leaves_no_orphan_instance(mig_daemon: Daemon) -> None:
    """A running job's instance is re-adopted and destroyed when it ends; an instance made while
    the daemon died before it noted the job's start is destroyed at restart."""
    adopted = job_on(mig_daemon, 10, "100", mig_profile="1g.10gb")  # runs on past the restart
    cut = job_on(mig_daemon, 30, "100", mig_profile="2g.20gb")
    uuid = mig_daemon.wait(adopted, ("running",))["mig_uuid"]
    mig_daemon.wait(cut, ("running",))
    mig_daemon.call("POST", f"/v1/jobs/{cut}/cancel", json={})
    mig_daemon.wait(cut)
    while not details(mig_daemon, cut, "mig"):  # its instance destroyed after its end
        time.sleep(0.05)
    mig_daemon.kill()
    # the moment between creating an instance and noting it: as the daemon left it
    store = Store(mig_daemon.state_dir / "state.db")
    spec = JobSpec((sys.executable, CUDA_JOB, "0.1", "100"), mode=Mode.MIG, mig_profile="2g.20gb")
    queued = store.add(spec, 0, "root")
    store.mig_intend(queued.id, 0, "2g.20gb", 0)
    store.close()
    node = SimNode.open_or_create(None, mig_daemon.node_dir)
    node.create_instance(0, "2g.20gb", 0)
    node.close()
    mig_daemon.start()
    assert details(mig_daemon, adopted, "mig")[0].endswith("re-adopted")
    assert details(mig_daemon, queued.id, "mig")[0] == "mig:2g.20gb@0/2 destroyed"
    assert uuid in {i["uuid"] for i in instances(mig_daemon, 0)}
    assert mig_daemon.wait(adopted)["exit_code"] == 0
    assert mig_daemon.wait(queued.id)["exit_code"] == 0  # it ran later, on an instance of its own
    assert instances_once_settled(mig_daemon, 0) == []


def test_kept_instances_serve_the_next_job(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "keep", SPEC, "--mig-keep-instances")
    try:
        first = daemon.wait(job_on(daemon, 0.1, "100", mig_profile="1g.10gb"))
        second = daemon.wait(job_on(daemon, 0.1, "100", mig_profile="1g.10gb"))
        assert first["mig_uuid"] == second["mig_uuid"]
        assert "kept for the next job" in details(daemon, first["id"], "mig")[0]
        assert details(daemon, second["id"], "placed")[0].endswith("(free)")
        assert [i["uuid"] for i in instances(daemon, 0)] == [first["mig_uuid"]]
    finally:
        daemon.stop()


def test_a_waiting_7g_job_is_not_starved_by_later_1g_jobs(tmp_path: Path) -> None:
    """A 1g job submitted after a waiting 7g one waits for it, though it fits now, and says so."""
    daemon = start_daemon(tmp_path / "fair", "gpus:\n  - model: H100\n    mig: true\n")
    try:
        holder = job_on(daemon, 5, "100", mig_profile="1g.10gb")
        daemon.wait(holder, ("running",))
        whole = job_on(daemon, 0.1, "100", mig_profile="7g.80gb")
        later = job_on(daemon, 0.1, "100", mig_profile="1g.10gb")
        assert waiting(daemon, later) == [
            f"it fits now, but would delay job {whole} queued ahead of it"
        ]
        assert daemon.job(later)["state"] == "queued"
        ended = daemon.wait(whole)
        assert ended["exit_code"] == 0 and ended["mig"].startswith("mig:7g.80gb@0/")
        assert daemon.wait(later)["started_at"] >= ended["finished_at"]
    finally:
        daemon.stop()
