"""Elastic memory on a real GPU: a PyTorch job suspended and resumed, a low job's burst.

A `gpupool serve` (state in a temporary directory) on GPU 0:
1. a PyTorch job fills --gib GiB with random tensors, keeps a host copy of their bytes, and
   computes on them; it is suspended (`POST /v1/jobs/N/suspend`), the GPU's memory in use is read
   from NVML while it is, then resumed; at its end the job compares its tensors with the host
   copy (bit-identical or not). The suspend and the resume are timed against one copy of the same
   bytes over this GPU's host link, measured by the job itself (a pinned host buffer);
2. a low job with `--memory 4Gi --memory-burst 16Gi` holding 12 GiB, then a high job with the
   rest of the GPU allocating it all: the high job must never get torch.cuda.OutOfMemoryError,
   the low job must finish with its data intact.
It never changes the GPU's modes, clocks or limits. Writes a markdown table to --out.

    PYTHONPATH=src python bench/gpu/elastic.py --out docs/benchmarks/elastic-memory-gpu.md
    PYTHONPATH=src python bench/gpu/elastic.py --simulate 1xA100-40GB --out /tmp/dry.md

`--simulate SPEC` is the dry run: the same daemon and steps on a simulated node, with
examples/elastic_job.py (ctypes) in place of PyTorch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpupool.api.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon_support import start_daemon, url

REPO = Path(__file__).resolve().parents[2]
SIM_JOB = REPO / "examples" / "elastic_job.py"
GiB = 1 << 30

TORCH_JOB = """
import sys, time, torch
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
n = int(gib * (1 << 30)) // 4
tensors = [torch.randn(n // 8, device="cuda") for _ in range(8)]
host = [t.cpu() for t in tensors]
pinned = torch.empty(n // 8 * 8, dtype=torch.float32, pin_memory=True)
torch.cuda.synchronize()
start = time.monotonic()
for i, t in enumerate(tensors):
    pinned[i * (n // 8):(i + 1) * (n // 8)].copy_(t, non_blocking=True)
torch.cuda.synchronize()
print(f"holding {gib} GiB; one copy {time.monotonic() - start:.4f} s", flush=True)
del pinned
a = torch.randn(1024, 1024, device="cuda")
end = time.monotonic() + seconds
while time.monotonic() < end:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
same = all(torch.equal(t.cpu(), h) for t, h in zip(tensors, host))
print("intact: bit-identical" if same else "CORRUPT", flush=True)
sys.exit(0 if same else 3)
"""

TORCH_FILL = """
import sys, time, torch
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
try:
    held = [torch.empty(1 << 28, dtype=torch.float32, device="cuda") for _ in range(int(gib))]
except torch.cuda.OutOfMemoryError:
    print("OutOfMemoryError", flush=True)
    sys.exit(2)
print(f"holding {gib} GiB", flush=True)
time.sleep(seconds)
"""


def _job(client: Client, argv: list[str], **share: Any) -> int:
    return int(
        client.call("POST", "/v1/jobs", json={"argv": argv, "workdir": "/tmp", **share})["job"][
            "id"
        ]
    )


def _out(root: Path, job: int) -> str:
    path = root / "state" / "jobs" / str(job) / "stdout"
    return path.read_text() if path.exists() else ""


def _until(check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("elastic: timed out")
        time.sleep(0.01)


def _state(client: Client, job: int) -> str:
    shown = client.call("GET", f"/v1/jobs/{job}").get("elastic")
    return "running" if shown is None else str(shown["state"])


def _used(root: Path, simulated: bool) -> int:
    """GPU 0's memory in use, as NVML (or the simulated node) reports it."""
    where = ["--node-dir", str(root / "node")] if simulated else []
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "gpus", "--json", *where],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout)["gpus"][0]["memory_used"])


def _end(client: Client, job: int) -> dict[str, Any]:
    while True:
        found = client.call("GET", f"/v1/jobs/{job}")
        if found["state"] not in ("queued", "running"):
            return dict(found)
        time.sleep(0.05)


def run(root: Path, spec: str | None, gib: float) -> list[tuple[str, str]]:
    rows = []
    daemon = start_daemon(root, spec)
    try:
        with Client(url(root)) as client:
            if spec is None:
                argv = [sys.executable, "-c", TORCH_JOB, str(gib), "6"]
            else:
                argv = [sys.executable, str(SIM_JOB), "6", str(int(gib * 1024))]
            job = _job(client, argv, memory=f"{int(gib) + 2}Gi")
            _until(lambda: "holding" in _out(root, job))
            before = _used(root, spec is not None)
            asked = time.monotonic()
            client.call("POST", f"/v1/jobs/{job}/suspend", json={})
            _until(lambda: _state(client, job) == "suspended")
            suspended = time.monotonic()
            during = _used(root, spec is not None)
            client.call("POST", f"/v1/jobs/{job}/resume", json={})
            _until(lambda: _state(client, job) == "running")
            resumed = time.monotonic()
            end = _end(client, job)
            text = _out(root, job)
            copy = text.split("one copy ")[1].split()[0] if "one copy" in text else "n/a"
            rows += [
                ("GPU memory in use: before, suspended", f"{before / GiB:.2f}, {during / GiB:.2f}"),
                ("suspend, resume (s)", f"{suspended - asked:.3f}, {resumed - suspended:.3f}"),
                ("one copy of the job's tensors to pinned host memory (s)", copy),
                ("the job's data", f"{end['state']}: {text.splitlines()[-1]}"),
            ]
            total = int(client.call("GET", "/v1/node")["gpus"][0]["memory_total"])
            rest = int(total / GiB) - 6
            if spec is None:
                low_argv = [sys.executable, "-c", TORCH_FILL, "12", "6"]
                high_argv = [sys.executable, "-c", TORCH_FILL, str(rest), "2"]
            else:
                low_argv = [sys.executable, str(SIM_JOB), "6", "3072", str(9 * 1024)]
                high_argv = [sys.executable, str(SIM_JOB), "2", str(rest * 1024)]
            low = _job(client, low_argv, memory="4Gi", memory_burst="16Gi", priority="low")
            _until(lambda: "holding" in _out(root, low) or "burst" in _out(root, low))
            high = _job(client, high_argv, memory=f"{rest + 1}Gi")
            high_end, low_end = _end(client, high), _end(client, low)
            rows += [
                (
                    f"high job allocating {rest} GiB beside the burst",
                    f"{high_end['state']}: {_out(root, high).splitlines()[0]}",
                ),
                ("the low job with the burst", f"{low_end['state']}"),
            ]
    finally:
        daemon.terminate()
        daemon.wait()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulate", metavar="SPEC", help="a simulated node: the dry run")
    parser.add_argument("--gib", type=float, default=8.0, help="the suspended job's tensors")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(Path(tmp), args.simulate, args.gib)
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip() if args.simulate is None else f"simulated {args.simulate}"  # fmt: skip
    table = "\n".join(["| measure | result |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])
    print(table)
    args.out.write_text(
        f"# Elastic memory on {gpu}\n\nCommand: `python bench/gpu/elastic.py`\n\n{table}\n"
    )


if __name__ == "__main__":
    main()
