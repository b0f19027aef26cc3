"""Slurm shares on a real dev cluster (munged, slurmctld, slurmd) wired to a gpupool daemon on a
simulated node, with jobs of real, distinct Unix users through srun and sbatch."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.users import User, check_interpreter, remove_tree, run_as, users, world_dir

from gpupool.isolation.arbiter import read_shares

PROBE = str(Path(__file__).with_name("probe.py"))
GIB = 1 << 30
#: the simulated GPU: 40 GiB, 10 shards
SPEC = "1xA100-40GB"

pytestmark = pytest.mark.skipif(
    shutil.which("slurmd", path="/usr/sbin:/usr/bin") is None
    or not Path("/usr/include/slurm/spank.h").exists(),
    reason="no Slurm here: `make slurm` as root installs slurmd, slurmctld, munge, libslurm-dev",
)


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {"SLURM_CONF": str(root / "slurm.conf")}

    def srun(self, user: User, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_as(user, ["srun", *argv], env=self.env, timeout=timeout)

    def sbatch(self, user: User, gres: str, script: str) -> int:
        done = run_as(
            user,
            ["sbatch", "--parsable", f"--gres={gres}", "--output=/dev/null", "--wrap", script],
            env=self.env,
        )
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().split(";")[0])

    def state(self, job: int) -> str:
        done = subprocess.run(
            ["squeue", "-h", "-j", str(job), "-o", "%T"],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", **self.env},
            check=False,
        )
        return done.stdout.strip()

    def shares(self) -> set[str]:
        return {p.name for p in (self.root / "shares").iterdir() if p.name != "lib"}


def _gpupool(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gpupool", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def people() -> Iterator[list[User]]:
    with users(3, prefix="gps") as made:
        check_interpreter(made[0])
        yield made


@pytest.fixture(scope="module")
def cluster(people: list[User]) -> Iterator[Cluster]:
    """Down (every job cancelled) before its users are removed: userdel refuses a user whose
    job still runs."""
    del people
    root = world_dir()
    try:
        _gpupool("slurm", "dev-cluster", "up", str(root), "--simulate", SPEC, "--shards", "10")
        yield Cluster(root)
    finally:
        _gpupool("slurm", "dev-cluster", "down", str(root))
        remove_tree(root)


def _wait(what: str, ready: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _values(text: str) -> dict[str, str]:
    pairs = (word.split("=", 1) for line in text.splitlines() for word in line.split())
    return {k: v for k, v in (p for p in pairs if len(p) == 2)}


def test_shards_are_the_device_total_and_oom_past_them(
    cluster: Cluster, people: list[User]
) -> None:
    done = cluster.srun(people[0], "--gres=shard:3", sys.executable, PROBE, "100")
    assert done.returncode == 0, done.stderr
    assert _values(done.stdout) == {"total": str(40 * GIB * 3 // 10), "alloc": "ok"}
    past = cluster.srun(people[0], "--gres=shard:3", sys.executable, PROBE, str(13 * 1024))
    assert "alloc=oom" in past.stdout, past.stdout + past.stderr
    whole = cluster.srun(people[0], "--gres=gpu:1", sys.executable, PROBE, str(30 * 1024))
    assert _values(whole.stdout) == {"total": str(40 * GIB), "alloc": "ok"}


def test_a_job_cannot_drop_or_enlarge_its_share(cluster: Cluster, people: list[User]) -> None:
    hostile = people[2]
    tricks = [
        "env", "-u", "LD_PRELOAD", "GPUPOOL_MEMORY_LIMIT_0=40Gi", "GPUPOOL_COMPUTE_LIMIT=100",
        "GPUPOOL_CONFIG_FILE=/dev/null", "setsid", "-w", sys.executable, PROBE, str(13 * 1024),
    ]  # fmt: skip
    done = cluster.srun(hostile, "--gres=shard:3", *tricks)
    assert _values(done.stdout).get("total") == str(40 * GIB * 3 // 10), done.stderr
    assert "alloc=oom" in done.stdout
    # its environment named no library at all: the loader preloads it from the job's /etc
    unset = cluster.srun(hostile, "--gres=shard:3", "sh", "-c", "cat /etc/ld.so.preload")
    assert "libgpupool-cuda.so" in unset.stdout
    # and nothing of it reached the host
    assert (
        not Path("/etc/ld.so.preload").exists()
        or "gpupool" not in Path("/etc/ld.so.preload").read_text()
    )


def test_shares_busy_together_get_their_shards(cluster: Cluster, people: list[User]) -> None:
    argv = [sys.executable, PROBE, "1", "6"]
    env = cluster.env
    small = subprocess.Popen(
        ["srun", "--gres=shard:3", *argv],
        user=people[0].uid,
        group=people[0].gid,
        env={"PATH": "/usr/bin:/bin", **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    large = cluster.srun(people[1], "--gres=shard:7", *argv)
    out, _ = small.communicate(timeout=60)
    kernels = int(_values(out)["kernels"]), int(_values(large.stdout)["kernels"])
    percent = 100 * kernels[0] / sum(kernels)
    assert abs(percent - 30) <= 5, kernels


def test_scancel_mid_run_leaves_no_share(cluster: Cluster, people: list[User]) -> None:
    job = cluster.sbatch(people[0], "shard:2", f"{sys.executable} {PROBE} 1 60")
    _wait("the job's share", lambda: str(job) in cluster.shares())
    subprocess.run(["scancel", str(job)], env={"PATH": "/usr/bin:/bin", **cluster.env}, check=True)
    _wait("the share's end", lambda: str(job) not in cluster.shares())


def test_a_pending_job_starts_when_another_ends(cluster: Cluster, people: list[User]) -> None:
    first = cluster.sbatch(people[0], "shard:7", f"{sys.executable} {PROBE} 1 4")
    _wait("the first job to run", lambda: cluster.state(first) == "RUNNING")
    second = cluster.sbatch(people[1], "shard:7", f"{sys.executable} {PROBE} 1 1")
    time.sleep(1.5)
    assert cluster.state(second) == "PENDING"  # 7 + 7 shards of 10: Slurm keeps it queued
    _wait("the second job to start", lambda: cluster.state(second) in ("RUNNING", ""), 60)
    _wait("both shares' end", lambda: not cluster.shares(), 60)


def test_ps_shows_the_job_share_with_its_slurm_job_id(cluster: Cluster, people: list[User]) -> None:
    job = cluster.sbatch(people[1], "shard:4", f"{sys.executable} {PROBE} 1 30")
    _wait("the job's share", lambda: str(job) in cluster.shares())
    url = f"unix://{cluster.root / 'state' / 'gpupool.sock'}"
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "ps", "--json", "--url", url],
        capture_output=True,
        text=True,
        check=True,
    )
    (share,) = [s for s in json.loads(done.stdout)["slurm"] if s["slurm_job_id"] == job]
    assert (share["user"], share["gpus"], share["shards"]) == (people[1].name, [0], 4)
    assert share["memory"] == 40 * GIB * 4 // 10 and share["compute_milli"] == 400
    # its settings hold its arbiter key: another user can read them neither there nor by name
    settings = cluster.root / "shares" / str(job) / "etc" / "gpupool" / "shim.conf"
    peek = run_as(people[2], ["cat", str(settings)])
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    subprocess.run(["scancel", str(job)], env={"PATH": "/usr/bin:/bin", **cluster.env}, check=True)
    _wait("the share's end", lambda: str(job) not in cluster.shares())


def test_a_node_whose_gres_disagrees_refuses_the_job_in_one_line(
    cluster: Cluster, people: list[User]
) -> None:
    prolog = cluster.root / "prolog"
    text = prolog.read_text()
    prolog.write_text(text.replace("--shards 10", "--shards 2"))  # gres.conf says 10 per GPU
    try:
        done = cluster.srun(people[0], "--gres=shard:3", "sh", "-c", "echo RAN")
    finally:
        prolog.write_text(text)
    assert "RAN" not in done.stdout and done.returncode != 0
    assert "3 shards of a GPU that has 2: gres.conf disagrees" in done.stderr
    assert "Traceback" not in done.stderr


def _arbiterd(directory: Path) -> int | None:
    """The pid of the arbiter of `directory` (this cluster's only)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if (
                len(argv) > 1
                and argv[0].endswith(b"gpupool-arbiterd")
                and argv[1] == bytes(directory)
            ):
                return int(cmdline.parent.name)
    return None


def test_a_restarted_arbiter_holds_the_running_slurm_shares_again(
    cluster: Cluster, people: list[User]
) -> None:
    job = cluster.sbatch(people[0], "shard:3", f"{sys.executable} {PROBE} 1 20")
    _wait("the job's share", lambda: str(job) in cluster.shares())
    share = json.loads((cluster.root / "shares" / str(job) / "share.json").read_text())
    arbiter = cluster.root / "node" / "arbiter"
    first = _arbiterd(arbiter)
    assert first is not None
    (view,) = arbiter.glob("gpu-*")
    killed_at = time.time_ns()
    os.kill(first, signal.SIGKILL)

    def held() -> bool:
        # a new arbiter makes a GPU's view afresh when a share is registered on that GPU
        with contextlib.suppress(OSError):
            if _arbiterd(arbiter) not in (None, first) and view.stat().st_ctime_ns > killed_at:
                return share["share_id"] in {s.share_id for s in read_shares(view)}
        return False

    try:
        _wait("the share registered with the new arbiter", held)
    finally:
        subprocess.run(["scancel", str(job)], env={"PATH": "/usr/bin:/bin", **cluster.env})
    _wait("the share's end", lambda: str(job) not in cluster.shares())


def test_slurmd_killed_mid_job_and_restarted_leaves_no_share(
    cluster: Cluster, people: list[User]
) -> None:
    job = cluster.sbatch(people[1], "shard:2", f"{sys.executable} {PROBE} 1 60")
    _wait("the job to run", lambda: cluster.state(job) == "RUNNING")
    slurmd = int((cluster.root / "slurmd.pid").read_text().split()[0])
    os.kill(slurmd, signal.SIGKILL)
    _wait("slurmd's end", lambda: not Path(f"/proc/{slurmd}").exists())
    assert str(job) in cluster.shares()  # its step runs on, held to its share
    conf = str(cluster.root / "slurm.conf")
    subprocess.run(["slurmd", "-f", conf, "-N", "gpupool0"], check=True, capture_output=True)
    subprocess.run(["scancel", str(job)], env={"PATH": "/usr/bin:/bin", **cluster.env}, check=True)
    _wait("the share's end", lambda: str(job) not in cluster.shares(), 60)


def test_the_watchdog_knows_a_slurm_jobs_processes(cluster: Cluster, people: list[User]) -> None:
    job = cluster.sbatch(people[0], "shard:2", f"{sys.executable} {PROBE} 1 60")
    url = f"unix://{cluster.root / 'state' / 'gpupool.sock'}"

    def events() -> list[dict[str, object]]:
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", "events", "--json", "--url", url],
            capture_output=True,
            text=True,
            check=True,
        )
        return list(json.loads(done.stdout)["events"])

    mine = f"slurm job {job}"
    _wait("the watchdog's pass over the job", lambda: any(mine in str(e) for e in events()))
    found = [e for e in events() if mine in str(e)]
    assert {e["kind"] for e in found} == {"exempt"}, found
    pids = {e["pid"] for e in found}
    assert not [e for e in events() if e["kind"] == "no_job" and e["pid"] in pids]
    subprocess.run(["scancel", str(job)], env={"PATH": "/usr/bin:/bin", **cluster.env}, check=True)
    _wait("the share's end", lambda: str(job) not in cluster.shares(), 60)


def test_a_job_may_ask_less_than_its_shards_never_more(
    cluster: Cluster, people: list[User]
) -> None:
    user = people[1]
    show = f"cat /etc/gpupool/shim.conf; {sys.executable} {PROBE} 1"
    less = cluster.srun(
        user, "--gres=shard:3", "--gpupool-memory=2Gi", "--gpupool-compute=20",
        "--gpupool-priority=low", "sh", "-c", show,
    )  # fmt: skip
    assert _values(less.stdout)["total"] == str(2 * GIB), less.stderr
    assert "GPUPOOL_COMPUTE_LIMIT=20" in less.stdout
    assert "GPUPOOL_COMPUTE_PRIORITY=low" in less.stdout
    more = cluster.srun(user, "--gres=shard:3", "--gpupool-memory=20Gi", "sh", "-c", "echo RAN")
    assert "RAN" not in more.stdout and more.returncode != 0
    assert "--gpupool-memory=20Gi is more than its shards give (12GiB of GPU memory)" in more.stderr
    bad = cluster.srun(user, "--gres=shard:3", "--gpupool-compute=150", "true")
    assert bad.returncode != 0 and "gpupool: invalid --gpupool-compute=150" in bad.stderr
    assert "Traceback" not in more.stderr + bad.stderr
