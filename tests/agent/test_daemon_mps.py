"""`--mode mps` through a real daemon on a simulated node: one control daemon per GPU (the twin,
started as the real one is), clients with unequal thread percentages busy at once, a server
killed with SIGKILL, the daemon killed with SIGKILL and restarted, and a control daemon that
will not start."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import CUDA_JOB, EXAMPLES, Daemon, cli, until
from tests.agent.test_daemon_recovery import _as_user, open_daemon, open_daemon_on

from gpupool.core.errors import InvalidRequest, Unschedulable

__all__ = ["open_daemon"]  # the fixture: a daemon other users can reach


@contextlib.contextmanager
def simulated_node(root: Path, spec: str) -> Iterator[Daemon]:
    running = Daemon(root, spec).start()
    try:
        yield running
    finally:
        running.stop()
        _kill_jobs(running)  # and its MPS control daemons


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Daemon]:
    with simulated_node(tmp_path, "2xA100-40GB") as running:
        yield running


@pytest.fixture
def one_gpu(tmp_path: Path) -> Iterator[Daemon]:
    with simulated_node(tmp_path, "1xH100-80GB") as running:
        yield running


FAILS_ON_LAUNCH_ERROR = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
ctx, module, function = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(module), b"x") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"loop") == 0
while True:
    rc = cuda.cuLaunchKernel(function, 256, 1, 1, 128, 1, 1, 0, None, None, None)
    if rc != 0:
        print(f"launch failed: CUDA error {rc}", flush=True)
        sys.exit(3)
    cuda.cuCtxSynchronize()
"""


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def running_pid(daemon: Daemon, job_id: int) -> int:
    daemon.wait(job_id, ("running",))
    pids = daemon.state_dir / "jobs" / str(job_id) / "pids.json"
    deadline = time.monotonic() + 20
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(json.loads(pids.read_text())["job"])


def kernels(daemon: Daemon, job_id: int) -> int:
    out = (daemon.state_dir / "jobs" / str(job_id) / "stdout").read_text()
    return int(out.split("done: ")[1].split()[0])


def control_gone(daemon: Daemon, gpu: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while (daemon.state_dir / "mps" / str(gpu) / "pipe").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.serial
def test_two_mps_jobs_30_and_70_share_one_gpu_at_once(node: Daemon) -> None:
    low = node.submit([sys.executable, CUDA_JOB, "8", "256"], mode="mps", compute=30)
    high = node.submit([sys.executable, CUDA_JOB, "8", "256"], mode="mps", compute=70)
    low_env, high_env = environ(running_pid(node, low)), environ(running_pid(node, high))
    assert low_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert high_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "70"
    pipe = node.state_dir / "mps" / "0" / "pipe"
    assert low_env["CUDA_MPS_PIPE_DIRECTORY"] == high_env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert "GPUPOOL_COMPUTE_LIMIT" not in low_env  # MPS provisions SMs: no time-slicing on top
    assert low_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].startswith("0=")
    server = node.job(low)["mps_server"]
    assert server and node.job(high)["mps_server"] == server
    assert f"mps:{server}" in cli("ps", url=node.url, check=True).stdout
    described = cli("describe", str(low), url=node.url, check=True).stdout
    assert f"a client of the MPS server pid {server}" in described
    [gpu0] = [gpu for gpu in node.call("GET", "/v1/node")["gpus"] if gpu["mps"]]
    assert gpu0["index"] == 0 and gpu0["mps"]["server"] == server
    assert sorted(c["job"] for c in gpu0["mps"]["clients"]) == [low, high]
    shown = cli("gpus", "--node-dir", str(node.node_dir), url=node.url, check=True).stdout
    assert "MPS servers" in shown and f"{low}:" in shown and str(server) in shown
    done_low, done_high = node.wait(low), node.wait(high)
    assert done_low["state"] == done_high["state"] == "succeeded"
    assert done_low["started_at"] < done_high["finished_at"] - 5  # busy at once for 5 s or more
    assert done_high["started_at"] < done_low["finished_at"] - 5
    # both ran at once, each at its share of the SMs
    assert 0.35 < kernels(node, low) / kernels(node, high) < 0.5
    assert control_gone(node, 0)
    assert not Path(f"/proc/{server}").exists()


REQUEST_LOOP = str(EXAMPLES / "request_loop.py")
# two clients of 50 ms kernels back to back: a job with two CUDA processes is two MPS clients,
# each with the job's percentage, so with a 50 % request loop beside it the SMs are oversubscribed
TWO_LONG_LOOPS = (
    f"{sys.executable} {REQUEST_LOOP} 4 12800 & {sys.executable} {REQUEST_LOOP} 4 12800; wait"
)


def results(daemon: Daemon, job_id: int) -> list[dict[str, float]]:
    assert daemon.wait(job_id)["state"] == "succeeded", daemon.job(job_id)["events"]
    out = (daemon.state_dir / "jobs" / str(job_id) / "stdout").read_text()
    return [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]


def requests_beside(daemon: Daemon, other_priority: str | None) -> dict[str, float]:
    """A high 50 % job's 2 s request loop (2 ms kernels on the whole GPU): alone when
    `other_priority` is None, else beside a busy 50 % job of that priority with long kernels."""
    other = None
    if other_priority is not None:
        argv = ["sh", "-c", TWO_LONG_LOOPS]
        other = daemon.submit(argv, mode="mps", compute=50, priority=other_priority)
        daemon.wait(other, ("running",))
        time.sleep(0.5)  # its two clients busy
    argv = [sys.executable, REQUEST_LOOP, "2", "512"]
    high = daemon.submit(argv, mode="mps", compute=50, priority="high")
    environment = environ(running_pid(daemon, high))
    assert environment["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    [result] = results(daemon, high)
    if other is not None:
        assert len(results(daemon, other)) == 2  # both its clients ran to the end
    return result


@pytest.mark.serial
def test_a_high_mps_job_beside_a_busy_low_one_with_long_kernels_is_as_fast_as_alone(
    one_gpu: Daemon,
) -> None:
    alone = requests_beside(one_gpu, None)
    beside_low = requests_beside(one_gpu, "low")
    beside_high = requests_beside(one_gpu, "high")
    assert beside_low["p50_ms"] < 1.3 * alone["p50_ms"]
    assert beside_low["requests"] > 0.8 * alone["requests"]
    # the same pair without priorities: the requests wait for the long kernels (about 4x alone
    # on a busy 2-core CI machine, 5x and more on a quiet one)
    assert beside_high["p50_ms"] > 2.5 * alone["p50_ms"]


@pytest.mark.serial
def test_a_low_mps_job_runs_beside_a_high_one_that_holds_every_sm(one_gpu: Daemon) -> None:
    """A low job holds no compute in admission: a one-process low job is admitted beside a high
    job at 100 % (the SMs oversubscribed), and its priority keeps it out of the high one's way."""
    requests = [sys.executable, REQUEST_LOOP, "2", "512"]
    alone = one_gpu.submit(requests, mode="mps", compute=100, memory="4GiB", priority="high")
    [served_alone] = results(one_gpu, alone)
    long_loop = [sys.executable, REQUEST_LOOP, "4", "12800"]
    low = one_gpu.submit(long_loop, mode="mps", compute=100, memory="4GiB", priority="low")
    running_pid(one_gpu, low)
    time.sleep(0.5)  # busy
    high = one_gpu.submit(requests, mode="mps", compute=100, memory="4GiB", priority="high")
    [served] = results(one_gpu, high)
    [_] = results(one_gpu, low)
    assert one_gpu.job(high)["started_at"] < one_gpu.job(low)["finished_at"]  # at once
    assert served["p50_ms"] < 1.3 * served_alone["p50_ms"]


def test_an_mps_jobs_priority_is_its_client_priority_whatever_its_own_environment(
    node: Daemon,
) -> None:
    raised = {"CUDA_MPS_CLIENT_PRIORITY": "0"}  # a low job may not make itself normal
    low = node.submit(
        [sys.executable, CUDA_JOB, "2"], mode="mps", compute=30, priority="low", env=raised
    )
    high = node.submit([sys.executable, CUDA_JOB, "2"], mode="mps", compute=30)
    assert environ(running_pid(node, low))["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert environ(running_pid(node, high))["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    assert node.wait(low)["state"] == node.wait(high)["state"] == "succeeded"


def test_a_killed_server_fails_its_clients_and_a_later_job_gets_a_new_one(node: Daemon) -> None:
    first = node.submit([sys.executable, CUDA_JOB, "60"], mode="mps", compute=30)
    # this one exits on its own at its first failed launch, maybe before the daemon looks
    second = node.submit([sys.executable, "-c", FAILS_ON_LAUNCH_ERROR], mode="mps", compute=70)
    other_gpu = node.submit([sys.executable, CUDA_JOB, "60"], mode="mps", compute=50)
    for job_id in (first, second, other_gpu):
        running_pid(node, job_id)
    server = node.job(first)["mps_server"]
    other_server = node.job(other_gpu)["mps_server"]
    assert node.job(second)["mps_server"] == server != other_server
    os.kill(server, signal.SIGKILL)
    for job_id in (first, second):
        ended = node.wait(job_id, timeout=30)
        assert ended["state"] == "failed"
        assert f"MPS server (pid {server})" in ended["events"][-1]["detail"]
    assert "CUDA error 807" in node.call("GET", f"/v1/jobs/{second}/logs")["data"]
    assert node.job(other_gpu)["state"] == "running"  # the other GPU's server is untouched
    assert Path(f"/proc/{other_server}").exists()
    later = node.submit([sys.executable, CUDA_JOB, "0.5"], mode="mps", compute=30)
    assert node.wait(later)["state"] == "succeeded"
    assert node.job(later)["mps_server"] not in (None, server)
    node.call("POST", f"/v1/jobs/{other_gpu}/cancel", json={})
    node.wait(other_gpu)
    assert control_gone(node, 0) and control_gone(node, 1)


def test_a_restarted_daemon_readopts_mps_jobs_or_fails_them_clearly(node: Daemon) -> None:
    kept = node.submit([sys.executable, CUDA_JOB, "4"], mode="mps", compute=40)
    lost = node.submit([sys.executable, CUDA_JOB, "60"], mode="mps", compute=40)
    running_pid(node, kept)
    running_pid(node, lost)
    server = node.job(kept)["mps_server"]
    assert node.job(lost)["mps_server"] == server
    node.kill()
    node.start()
    assert node.job(kept)["mps_server"] == server
    assert node.wait(kept)["state"] == "succeeded"  # adopted with its server
    assert node.job(lost)["state"] == "running"
    node.kill()
    os.kill(server, signal.SIGKILL)  # while no daemon watches
    node.start()
    failed = node.wait(lost, timeout=30)
    assert failed["state"] == "failed"
    assert f"MPS server (pid {server})" in failed["events"][-1]["detail"]
    assert control_gone(node, 0)


def test_bad_mps_requests_are_refused_in_one_line(node: Daemon) -> None:
    with pytest.raises(Unschedulable, match="largest GPU it may use has 40GiB"):
        node.submit(["true"], mode="mps", memory="50GiB")
    with pytest.raises(InvalidRequest, match="mode mps runs a job on one GPU"):
        node.submit(["true"], mode="mps", gpus=2)
    done = cli("submit", "--mode", "mps", "--memory", "50GiB", "--", "true", url=node.url)
    assert done.returncode != 0 and done.stderr.count("\n") == 1
    assert node.call("GET", "/v1/jobs", params={"all": True})["jobs"] == []


def test_a_control_daemon_that_will_not_start_fails_the_job_with_its_last_words(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken-mps-control"
    broken.write_text(
        "#!/bin/sh\n"
        'mkdir -p "$CUDA_MPS_LOG_DIRECTORY"\n'
        'echo "[x] Failed to start: no MPS-capable GPU" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"\n'
        "exit 1\n"
    )
    broken.chmod(0o755)
    daemon = Daemon(tmp_path, "1xA100-40GB", env={"GPUPOOL_MPS_CONTROL": str(broken)}).start()
    try:
        job_id = daemon.submit(["true"], mode="mps", compute=50)
        ended = daemon.wait(job_id)
        detail = ended["events"][-1]["detail"]
        assert ended["state"] == "failed"
        assert "did not start: [x] Failed to start: no MPS-capable GPU" in detail
        assert "\n" not in detail
        assert not (daemon.state_dir / "mps" / "0" / "pipe").exists()
    finally:
        daemon.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_another_users_mps_job_waits_for_the_gpus_server_then_gets_its_own(
    open_daemon: Daemon,
) -> None:
    daemon = open_daemon
    os.chmod(daemon.state_dir / "gpupool.sock", 0o666)
    mine = daemon.submit([sys.executable, CUDA_JOB, "4"], mode="mps", compute=30)
    running_pid(daemon, mine)
    root_server = daemon.job(mine)["mps_server"]
    body = {"argv": ["sh", "-c", "id -u"], "mode": "mps", "compute": 30, "workdir": "/tmp"}
    [submitted] = _as_user(65534, daemon.state_dir / "gpupool.sock", [("POST", "/v1/jobs", body)])
    theirs = submitted[1]["job"]["id"]
    time.sleep(1)
    waiting = daemon.job(theirs)
    assert waiting["state"] == "queued"
    assert waiting["waiting"] == ["GPU 0's MPS server serves uid 0 until their MPS jobs there end"]
    assert daemon.wait(mine)["state"] == "succeeded"
    ran = daemon.wait(theirs)
    assert ran["state"] == "succeeded", ran["events"]
    assert ran["mps_server"] not in (None, root_server)
    assert daemon.call("GET", f"/v1/jobs/{theirs}/logs")["data"] == "65534\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_another_users_mps_job_takes_a_gpu_without_a_server_rather_than_wait() -> None:
    with open_daemon_on("2xA100-40GB") as daemon:
        socket_path = daemon.state_dir / "gpupool.sock"
        os.chmod(socket_path, 0o666)
        # a small share: a packing policy would put the next one beside it
        mine = daemon.submit([sys.executable, CUDA_JOB, "30"], mode="mps", compute=30)
        running_pid(daemon, mine)
        [gpu] = daemon.job(mine)["gpus"]
        body = {"argv": ["sleep", "30"], "mode": "mps", "compute": 30, "workdir": "/tmp"}
        [[_, answer]] = _as_user(65534, socket_path, [("POST", "/v1/jobs", body)])
        theirs = answer["job"]["id"]
        # the other GPU at once, with a server of its own, not queued behind root's server
        assert until(lambda: daemon.job(theirs)["state"] == "running", timeout=15)
        assert daemon.job(theirs)["gpus"] == [1 - gpu]
        assert daemon.job(theirs)["mps_server"] != daemon.job(mine)["mps_server"]
        # a third user's, with both GPUs' servers taken, waits and says for whom
        [[_, answer]] = _as_user(65533, socket_path, [("POST", "/v1/jobs", body)])
        third = answer["job"]["id"]
        servers = {gpu: 0, 1 - gpu: 65534}
        expected = [
            f"GPU {g}'s MPS server serves uid {servers[g]} until their MPS jobs there end"
            for g in (0, 1)
        ]
        assert until(lambda: daemon.job(third)["waiting"] == expected, timeout=10)
        assert daemon.job(third)["state"] == "queued"
