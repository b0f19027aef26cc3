"""The watchdog on a real GPU: escapes from a share caught by NVML's per-process memory.

A `gpupool serve --watchdog kill` (state in a temporary directory) runs a PyTorch job under a
`--limit-gib` share on GPU 0. The job holds 1 GiB through the interception library, then starts
a child without LD_PRELOAD that allocates `--escape-gib` GiB past the share, as a user escaping
the share would. Then a PyTorch process the daemon never started allocates 1 GiB. Checked for
each: the watchdog's event (`over_share` for the job, `no_job` for the stranger) comes within
5 s of the allocation, by the driver's own per-process figures (NVML), and the kill is recorded
and done. It never changes the GPU's modes, clocks or limits. Writes a markdown table to --out.

    PYTHONPATH=src python bench/gpu/watchdog.py --out docs/benchmarks/watchdog-gpu.md
    PYTHONPATH=src python bench/gpu/watchdog.py --simulate 1xA30 --out /tmp/dry.md

`--simulate SPEC` is the dry run: the same daemon and checks on a simulated node, with ctypes
in place of PyTorch (needs `make -C native`). Needs torch (on a GPU), nvidia-ml-py, httpx, and
fastapi, uvicorn and pydantic for the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from gpupool.api.client import Client

# the daemon benchmarks' start and stop, one directory up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon_support import start_daemon, url
from job_snippets import CTYPES_CONTEXT

GiB = 1 << 30
WITHIN_S = 5.0

#: `job.py torch|ctypes parent|child|stranger GIB SECONDS [ESCAPE_GIB]`
JOB = (
    """
import ctypes, json, os, subprocess, sys, time
kind, role, gib, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
size = int(gib * 2**30)
if kind == "torch":
    import torch
    held = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
else:
"""
    + textwrap.indent(CTYPES_CONTEXT, "    ")
    + """
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0
print("HOLDING " + json.dumps({"role": role, "pid": os.getpid(), "at": time.time()}), flush=True)
if role == "parent":
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    argv = [sys.executable, __file__, kind, "child", sys.argv[5], sys.argv[4]]
    sys.exit(subprocess.run(argv, env=env).returncode)
time.sleep(seconds)
"""
)


def _holding(text: str, role: str) -> dict[str, Any] | None:
    for line in text.splitlines():
        if line.startswith("HOLDING "):
            data = json.loads(line[8:])
            if data["role"] == role:
                return dict(data)
    return None


def _events(client: Client) -> list[dict[str, Any]]:
    return list(client.call("GET", "/v1/events", params={"limit": 1000})["events"])


def _wait(what: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    return None


def escape_row(client: Client, root: Path, args: argparse.Namespace, kind: str) -> str:
    """A job whose child drops LD_PRELOAD and allocates past the share."""
    passed = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
    argv = [sys.executable, str(root / "job.py"), kind, "parent", "1", "60", str(args.escape_gib)]
    body = {"argv": argv, "memory": f"{args.limit_gib}GiB", "env": passed, "workdir": str(root)}
    job_id = client.call("POST", "/v1/jobs", json=body)["job"]["id"]

    def stdout() -> str:
        return str(client.call("GET", f"/v1/jobs/{job_id}/logs")["data"])

    child = _wait(lambda: _holding(stdout(), "child"))
    found = _wait(
        lambda: next(
            (e for e in _events(client) if e["kind"] == "over_share" and e["job_id"] == job_id),
            None,
        ),
        timeout=30,
    )
    kills = _wait(
        lambda: [
            e for e in _events(client) if e["kind"] == "watchdog_kill" and e["job_id"] == job_id
        ],
        timeout=10,
    )
    ended = _wait(lambda: _finished(client, job_id), timeout=30)
    return _row(
        f"job under a {args.limit_gib} GiB share, child without LD_PRELOAD takes "
        f"{args.escape_gib:g} GiB",
        child,
        found,
        kills or [],
        bool(ended),
    )


def _finished(client: Client, job_id: int) -> bool:
    return client.call("GET", f"/v1/jobs/{job_id}")["state"] not in ("queued", "running")


def stranger_row(client: Client, root: Path, args: argparse.Namespace, kind: str) -> str:
    """A process the daemon did not start."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if args.simulate:
        from gpupool.isolation.libraries import native_libraries

        env["LD_LIBRARY_PATH"] = str(native_libraries().sim_dir)
        env["GPUPOOL_SIM_NODE"] = str(root / "node")
    argv = [sys.executable, str(root / "job.py"), kind, "stranger", "1", "60"]
    stranger = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert stranger.stdout is not None
    holding = _holding(stranger.stdout.readline(), "stranger")
    found = _wait(
        lambda: next(
            (e for e in _events(client) if e["kind"] == "no_job" and e["pid"] == stranger.pid),
            None,
        ),
        timeout=30,
    )
    kills = _wait(
        lambda: [
            e for e in _events(client) if e["kind"] == "watchdog_kill" and e["pid"] == stranger.pid
        ],
        timeout=10,
    )
    try:
        code = stranger.wait(timeout=30)
    except subprocess.TimeoutExpired:
        stranger.kill()
        code = stranger.wait()
    return _row(
        "a process the daemon did not start takes 1 GiB", holding, found, kills or [], code == -9
    )


def _row(
    what: str,
    holding: dict[str, Any] | None,
    found: dict[str, Any] | None,
    kills: list[dict[str, Any]],
    ended: bool,
) -> str:
    after = float(found["at"]) - float(holding["at"]) if found and holding else None
    killed = bool(kills) and all("killed with SIGKILL" in e["detail"] for e in kills)
    ok = after is not None and after <= WITHIN_S and killed and ended
    shown = "not caught" if after is None else f"{after:.2f} s"
    detail = found["detail"] if found else ""
    return (
        f"| {what} | {shown} | {detail} | {len(kills)} recorded, "
        f"{'all done' if killed else 'NOT all done'} | {'yes' if ok else 'NO'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--simulate", metavar="SPEC", help="dry run on a simulated node")
    parser.add_argument("--limit-gib", type=int, default=2, help="the job's memory share, GiB")
    parser.add_argument("--escape-gib", type=float, default=2.0, help="what the child takes")
    args = parser.parse_args()
    kind = "ctypes" if args.simulate else "torch"
    # a short directory: the daemon's socket path must fit in 108 bytes
    with tempfile.TemporaryDirectory(prefix="gpupool-gpu-wd-", dir="/tmp") as tmp:
        root = Path(tmp)
        (root / "job.py").write_text(JOB)
        daemon = start_daemon(root, args.simulate, "--watchdog", "kill")
        try:
            with Client(url(root)) as client:
                reserve = int(client.call("GET", "/v1/node")["context_reserve"])
                rows = [
                    escape_row(client, root, args, kind),
                    stranger_row(client, root, args, kind),
                ]
        finally:
            daemon.terminate()
            daemon.wait()
    where = f"simulated node {args.simulate} (dry run)" if args.simulate else "real GPU 0 (NVML)"
    text = "\n".join(
        [
            f"gpupool watchdog (--watchdog kill) on {where}, context reserve "
            f"{reserve >> 20} MiB per process",
            "",
            "| escape | caught after the allocation | event | kills | pass |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
