"""A real daemon on a simulated node: submit, ps, logs, wait, admission, describe, bad input."""

from __future__ import annotations

import json
import re
import resource
import sys
import time
from pathlib import Path

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, cli

from gpupool.core.errors import InvalidRequest, NotFound, Unschedulable
from gpupool.core.units import GiB
from gpupool.isolation.arbiter_control import node_arbiter_dir


def test_submit_prints_the_id_alone_and_wait_returns_the_exit_code(daemon: Daemon) -> None:
    done = cli(
        "submit",
        "--compute",
        "20",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
        url=daemon.url,
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    waited = cli("wait", str(job_id), url=daemon.url)
    assert waited.returncode == 3
    logs = cli("logs", str(job_id), url=daemon.url)
    assert logs.stdout == "out\n" and logs.stderr == "err\n"
    as_json = json.loads(cli("logs", str(job_id), "--json", url=daemon.url, check=True).stdout)
    assert as_json == {"id": job_id, "stdout": "out\n", "stderr": "err\n"}
    ps = json.loads(cli("ps", "--all", "--json", url=daemon.url, check=True).stdout)
    (job,) = ps["jobs"]
    assert {k: job[k] for k in ("id", "state", "exit_code", "gpus", "compute", "mode")} == {
        "id": job_id,
        "state": "failed",
        "exit_code": 3,
        "gpus": [0],
        "compute": 20,
        "mode": "shim",
    }
    assert job["memory"] == 8 * GiB  # 20 % of a 40 GiB GPU, as the compute share
    for key in ("name", "user", "priority", "submitted_at", "started_at", "finished_at"):
        assert job[key] is not None


def test_submit_wait_follows_output_and_exits_with_the_code(daemon: Daemon) -> None:
    done = cli(
        "submit", "--wait", "--compute", "10", "--", "sh", "-c", "echo hi; exit 7", url=daemon.url
    )
    assert done.returncode == 7
    assert done.stdout.splitlines()[-1] == "hi"


def test_the_share_reaches_the_job_through_the_launch_spec(daemon: Daemon) -> None:
    job_id = daemon.submit(
        ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES $GPUPOOL_MEMORY_LIMIT_0 $GPUPOOL_COMPUTE_LIMIT"],
        memory="6GiB",
        compute=25,
    )
    daemon.wait(job_id)
    out = daemon.call("GET", f"/v1/jobs/{job_id}/logs")["data"]
    assert out.split() == ["0", str(6 * GiB), "25"]
    # the queue's priority is the compute arbiter's too: the node's arbiter, which root's
    # `gpupool exec` uses as well, holds the share registered under a name only it was given
    low = daemon.submit(
        ["sh", "-c", "echo $GPUPOOL_COMPUTE_PRIORITY $GPUPOOL_ARBITER_DIR $GPUPOOL_ARBITER_SHARE"],
        compute=25,
        priority="low",
    )
    daemon.wait(low)
    priority, arbiters, share = daemon.call("GET", f"/v1/jobs/{low}/logs")["data"].split()
    assert priority == "low"
    assert arbiters == str(node_arbiter_dir(daemon.node_dir))
    assert re.fullmatch(r"[0-9a-f]{16}:[0-9a-f]{16}", share), share
    exclusive = daemon.submit(
        ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES ${GPUPOOL_MEMORY_LIMIT_0:-none}"],
        gpus=2,
        mode="exclusive",
    )
    daemon.wait(exclusive)
    assert daemon.call("GET", f"/v1/jobs/{exclusive}/logs")["data"].split() == ["0,1", "none"]


def _admitted(jobs: list[dict[str, object]]) -> dict[int, tuple[int, int]]:
    per_gpu: dict[int, tuple[int, int]] = {}
    for job in jobs:
        if job["state"] != "running":
            continue
        for gpu in job["gpus"]:  # type: ignore[attr-defined]
            memory, compute = per_gpu.get(gpu, (0, 0))
            per_gpu[gpu] = (memory + int(job["memory"]), compute + int(job["compute"]))  # type: ignore[call-overload]
    return per_gpu


def test_no_gpu_is_ever_over_committed_while_shares_run_at_once(daemon: Daemon) -> None:
    shares = [
        (30, "12GiB", 900),
        (50, "20GiB", 2000),
        (40, "16GiB", 1000),
        (20, "30%", 3000),
        (60, "10GiB", 500),
        (10, "4GiB", 800),
    ] * 2
    ids = [
        daemon.submit([sys.executable, CUDA_JOB, "1.0", str(hold)], compute=c, memory=m)
        for c, m, hold in shares
    ]
    seen_running = 0
    while True:
        jobs = daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]
        for memory, compute in _admitted(jobs).values():
            assert memory <= 40 * GiB and compute <= 100
        gpus = json.loads(
            cli(
                "gpus", "--node-dir", str(daemon.node_dir), "--json", url=daemon.url, check=True
            ).stdout
        )
        for gpu in gpus["gpus"]:
            assert gpu["memory_used"] <= gpu["memory_total"]
        seen_running = max(seen_running, sum(j["state"] == "running" for j in jobs))
        if all(j["state"] in ("succeeded", "failed") for j in jobs):
            break
        time.sleep(0.2)
    assert seen_running >= 3  # shares really ran side by side
    assert all(daemon.job(i)["exit_code"] == 0 for i in ids)
    assert max(daemon.job(i)["peak_memory"] or 0 for i in ids) > 0


def test_memory_past_the_share_fails_with_out_of_memory_and_is_recorded(daemon: Daemon) -> None:
    job_id = daemon.submit(
        [sys.executable, CUDA_JOB, "0.2", "512", "4096"], memory="2GiB", compute=10
    )
    job = daemon.wait(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 2 and job["oom"]
    assert "oom" in [e["kind"] for e in job["events"]]


def test_live_memory_shows_in_ps(daemon: Daemon) -> None:
    job_id = daemon.submit([sys.executable, CUDA_JOB, "4", "1536"], memory="4GiB", compute=20)
    deadline = time.monotonic() + 20
    live = None
    while time.monotonic() < deadline and not live:
        jobs = daemon.call("GET", "/v1/jobs")["jobs"]
        live = next((j["live_memory"] for j in jobs if j["id"] == job_id), None)
        time.sleep(0.2)
    assert live == 1536 << 20
    assert "1.5GiB" in cli("ps", url=daemon.url, check=True).stdout


def test_never_fitting_and_bad_requests_are_refused_and_nothing_is_stored(daemon: Daemon) -> None:
    cases = [
        ({"memory": "50GiB"}, Unschedulable, "largest GPU it may use has 40GiB"),
        ({"gpus": 3}, Unschedulable, "asks for 3 GPUs and this node has 2"),
        ({"gpu_models": ["H100-80GB"]}, Unschedulable, "this node has A100-40GB"),
        ({"compute": 0}, InvalidRequest, "invalid compute"),
        ({"mode": "warp"}, InvalidRequest, "unknown mode 'warp'"),
        ({"memory": "lots"}, InvalidRequest, "invalid memory size"),
    ]
    for share, error, words in cases:
        with pytest.raises(error, match=words):
            daemon.submit(["true"], **share)
    assert daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"] == []
    with pytest.raises(NotFound, match="no job 42"):
        daemon.job(42)
    bad = cli("submit", "--compute", "0", "--", "true", url=daemon.url)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    missing = cli("cancel", "42", url=daemon.url)
    assert missing.returncode == 2 and missing.stderr.strip() == "gpupool: error: no job 42"


def test_describe_says_which_gpu_lacks_what_while_queued(daemon: Daemon) -> None:
    hog = daemon.submit(["sleep", "30"], gpus=2, compute=70, memory="30GiB")
    daemon.wait(hog, ("running",))
    waiting = daemon.submit(["true"], compute=50, memory="4GiB")
    time.sleep(0.5)
    reasons = daemon.job(waiting)["waiting"]
    assert "GPU 0: compute 50% needed, 30% free" in reasons
    assert "GPU 1: compute 50% needed, 30% free" in reasons
    shown = cli("describe", str(waiting), url=daemon.url, check=True).stdout
    assert "waiting because:" in shown and "GPU 1: compute 50% needed" in shown
    daemon.call("POST", f"/v1/jobs/{hog}/cancel", json={})
    assert daemon.wait(waiting)["state"] == "succeeded"


def test_no_daemon_says_how_to_start_one(tmp_path: object) -> None:
    done = cli("ps", url="unix:///nonexistent/gpupool.sock")
    assert done.returncode == 7
    assert (
        "no gpupool daemon at unix:///nonexistent/gpupool.sock: start one with `gpupool serve`"
        in done.stderr
    )


def test_the_daemon_raises_its_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    """It keeps each running share's region open: the default soft limit would not do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))  # the daemon inherits it
    try:
        daemon = Daemon(tmp_path, "1xA100-40GB").start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert daemon.process is not None
        limits = Path(f"/proc/{daemon.process.pid}/limits").read_text().splitlines()
        (line,) = [row for row in limits if row.startswith("Max open files")]
        assert line.split()[3] == str(hard)
    finally:
        daemon.stop()
