"""Slurm shares on a dev cluster against the issue's targets (docs/benchmarks/slurm.md).

One `gpupool slurm dev-cluster` (1xA100-40GB, 10 shards), real users' jobs through srun/sbatch:
- compute: an exclusive job (`--gres=gpu:1`) alone for S seconds, then `shard:3` and `shard:7`
  of two users busy together: each one's kernels per second as a percent of the exclusive one's
  (targets 30 and 70, within 5 points), and of the two together;
- memory: the device total a `shard:K` job sees, against K/10 of the GPU;
- overhead: `srun --gres=shard:1 true`, N times, with gpupool (Prolog, Epilog, SPANK plugin) and
  with them taken out of slurm.conf (`scontrol reconfigure`): the medians' difference;
- churn: JOBS `shard:1` jobs submitted at once by 4 users: how many ran (their output), shares
  left after, and the node daemon's RSS before and after.
Usage (root: it makes users):  python bench/slurm.py [--seconds S] [--runs N] [--jobs J]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.users import User, remove_tree, run_as, users, world_dir  # noqa: E402

PROBE = str(ROOT / "tests" / "slurm" / "probe.py")
GIB = 1 << 30
GPUPOOL_LINES = ("Prolog=", "Epilog=", "PlugStackConfig=")


def gpupool(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gpupool", *args], check=True, capture_output=True)


def kernels_per_s(text: str, seconds: float) -> float:
    found = re.search(r"kernels=(\d+)", text)
    return int(found.group(1)) / seconds if found else 0.0


def compute(root: Path, people: list[User], seconds: float) -> dict[str, float]:
    env = {"SLURM_CONF": str(root / "slurm.conf")}
    probe = [sys.executable, PROBE, "1", str(seconds)]
    alone = run_as(people[0], ["srun", "--gres=gpu:1", *probe], env=env, timeout=120)
    exclusive = kernels_per_s(alone.stdout, seconds)
    small = subprocess.Popen(
        ["srun", "--gres=shard:3", *probe],
        user=people[0].uid,
        group=people[0].gid,
        env={"PATH": "/usr/bin:/bin", **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    large = run_as(people[1], ["srun", "--gres=shard:7", *probe], env=env, timeout=120)
    out, _ = small.communicate(timeout=120)
    three, seven = kernels_per_s(out, seconds), kernels_per_s(large.stdout, seconds)
    return {
        "exclusive_kernels_per_s": round(exclusive, 1),
        "shard3_pct_of_exclusive": round(100 * three / exclusive, 1),
        "shard7_pct_of_exclusive": round(100 * seven / exclusive, 1),
        "shard3_pct_of_both": round(100 * three / (three + seven), 1),
    }


def memory(root: Path, user: User) -> dict[str, object]:
    env = {"SLURM_CONF": str(root / "slurm.conf")}
    seen = {}
    for shards in (1, 3, 10):
        done = run_as(user, ["srun", f"--gres=shard:{shards}", sys.executable, PROBE, "1"], env=env)
        total = int(re.search(r"total=(\d+)", done.stdout).group(1))  # type: ignore[union-attr]
        seen[f"shard:{shards}"] = (total, total == 40 * GIB * shards // 10)
    return seen


def srun_median_ms(root: Path, user: User, runs: int) -> float:
    env = {"SLURM_CONF": str(root / "slurm.conf")}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run_as(user, ["srun", "--gres=shard:1", "true"], env=env, timeout=60)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def overhead(root: Path, user: User, runs: int) -> dict[str, float]:
    with_gpupool = srun_median_ms(root, user, runs)
    conf = root / "slurm.conf"
    text = conf.read_text()
    conf.write_text(
        "".join(line for line in text.splitlines(True) if not line.startswith(GPUPOOL_LINES))
    )
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)}
    subprocess.run(["scontrol", "reconfigure"], env=env, check=True)
    time.sleep(2)
    try:
        without = srun_median_ms(root, user, runs)
    finally:
        conf.write_text(text)
        subprocess.run(["scontrol", "reconfigure"], env=env, check=True)
        time.sleep(2)
    return {
        "median_ms_with": round(with_gpupool, 1),
        "median_ms_without": round(without, 1),
        "added_ms": round(with_gpupool - without, 1),
    }


def rss_kib(root: Path) -> int:
    pid = (root / "gpupool.pid").read_text().split()[0]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def churn(root: Path, people: list[User], jobs: int) -> dict[str, object]:
    env = {"SLURM_CONF": str(root / "slurm.conf")}
    out = root / "out"
    out.mkdir()
    out.chmod(0o1777)  # every user's job writes its output here
    before = rss_kib(root)
    start = time.monotonic()
    for i in range(jobs):
        user = people[i % len(people)]
        run_as(
            user,
            [
                "sbatch",
                "--gres=shard:1",
                f"--output={out}/%j",
                "--wrap",
                f"{sys.executable} {PROBE} 1",
            ],
            env=env,
        )
    squeue = {"PATH": "/usr/bin:/bin", **env}
    while subprocess.run(
        ["squeue", "-h"], env=squeue, capture_output=True, text=True
    ).stdout.strip():
        time.sleep(1)
    elapsed = time.monotonic() - start
    time.sleep(3)  # the last Epilogs
    ran = sum("alloc=ok" in p.read_text() for p in out.iterdir())
    left = [p.name for p in (root / "shares").iterdir() if p.name != "lib"]
    return {
        "jobs": jobs,
        "ran_once_ok": ran,
        "outputs": len(list(out.iterdir())),
        "shares_left": len(left),
        "seconds": round(elapsed, 1),
        "daemon_rss_kib_before": before,
        "daemon_rss_kib_after": rss_kib(root),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    root = world_dir()
    try:
        gpupool("slurm", "dev-cluster", "up", str(root), "--simulate", "1xA100-40GB")
        with users(4, prefix="gpb") as people:
            print("compute:", compute(root, people, args.seconds), flush=True)
            print("memory:", memory(root, people[0]), flush=True)
            print("overhead:", overhead(root, people[0], args.runs), flush=True)
            print("churn:", churn(root, people, args.jobs), flush=True)
    finally:
        gpupool("slurm", "dev-cluster", "down", str(root))
        remove_tree(root)


if __name__ == "__main__":
    main()
