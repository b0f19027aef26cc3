"""The escapes of issue 11 as job commands, and waiting for the watchdog's events, for the tests
and bench/watchdog.py: a job under a 2 GiB share holds 1.5 GiB through the interception library
and one more process of it takes 1 GiB past the share in one of the ways interception misses."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent.daemon_support import CUDA_JOB, Daemon

from gpupool.devices.procfs import process_start_time
from gpupool.devices.sim.state import MAX_PROCS, PROC_GRAPHICS, STATE_FILE, SimProcSlot, SimState
from gpupool.isolation.libraries import native_libraries

SHARE = "2Gi"
HELD_MIB = 1536  # within the share, through the interception library
ESCAPE_MIB = 1024  # past the share, by the escape
PROGS = Path(__file__).resolve().parent / "progs"
INCLUDE = Path(__file__).resolve().parents[2] / "native" / "include"

#: the escapes a job's process can take, each a shell prefix that runs a CUDA program past the
#: share (`{dir}` is a private scratch directory, `{prog}` the dlvsym program)
ESCAPES: dict[str, str] = {
    "unset LD_PRELOAD": "env -u LD_PRELOAD",
    "unset GPUPOOL_SHARED_REGION": "env -u GPUPOOL_SHARED_REGION",
    "redirect GPUPOOL_SHARED_REGION": "env GPUPOOL_SHARED_REGION={dir}/own.region",
    "own GPUPOOL_CONFIG_FILE": "env GPUPOOL_CONFIG_FILE={dir}/own.conf",
    "dlvsym for the real dlsym": "",
}


def build_dlvsym(out: Path) -> Path:
    """The C program that fetches the real dlsym with dlvsym, then the real cuMemAlloc."""
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Werror",
            f"-I{INCLUDE}",
            "-o",
            str(out),
            str(PROGS / "escape_dlvsym.c"),
            "-ldl",
        ],
        check=True,
    )
    return out


def escape_command(kind: str, scratch: Path, prog: Path, seconds: int = 60) -> list[str]:
    """A job that holds HELD_MIB within its share and escapes it with ESCAPE_MIB more."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "own.conf").write_text("GPUPOOL_MEMORY_LIMIT=64Gi\n")
    python, job = shlex.quote(sys.executable), shlex.quote(CUDA_JOB)
    if kind == "dlvsym for the real dlsym":
        escaper = f"{shlex.quote(str(prog))} {ESCAPE_MIB} {seconds}"
    else:
        prefix = ESCAPES[kind].format(dir=shlex.quote(str(scratch)))
        escaper = f"{prefix} {python} {job} {seconds} {ESCAPE_MIB}"
    script = f"{python} {job} {seconds} {HELD_MIB} & {escaper} & wait"
    return ["sh", "-c", script]


def foreign_process(node_dir: Path, seconds: int = 60) -> subprocess.Popen[str]:
    """A CUDA program on the node that the daemon never started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "LD_"))}
    env["LD_LIBRARY_PATH"] = str(native_libraries().sim_dir)
    env["GPUPOOL_SIM_NODE"] = str(node_dir)
    return subprocess.Popen(
        [sys.executable, CUDA_JOB, str(seconds), str(ESCAPE_MIB)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def graphics_process(node_dir: Path, memory: int = 256 << 20) -> subprocess.Popen[str]:
    """A process the driver lists as graphics only (a display server), staged in a free slot of
    the simulated node as NVML would list it: the simulated driver itself serves CUDA only."""
    process = subprocess.Popen(["sleep", "60"], text=True)
    start = process_start_time(process.pid)
    assert start is not None
    state = SimState.open(node_dir / STATE_FILE)
    try:
        taken = {slot.slot for slot in state.procs(live_only=False)}
        free = min(set(range(MAX_PROCS)) - taken)
        state.write_proc(
            free, SimProcSlot(free, process.pid, 0, start, memory, 0, 0, PROC_GRAPHICS)
        )
    finally:
        state.close()
    return process


def wait_for_line(read: Callable[[], str], marker: str, timeout: float = 30) -> float:
    """When `marker` first shows in what `read` returns (time.time())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker in read():
            return time.time()
        time.sleep(0.02)
    raise AssertionError(f"{marker!r} not seen in {timeout} s: {read()!r}")


def job_stdout(daemon: Daemon, job_id: int) -> Callable[[], str]:
    path = daemon.state_dir / "jobs" / str(job_id) / "stdout"
    return lambda: path.read_text() if path.exists() else ""


def wait_for_event(
    daemon: Daemon, match: Callable[[dict[str, Any]], bool], timeout: float = 15
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in daemon.call("GET", "/v1/events", params={"limit": 1000})["events"]:
            if match(event):
                return event
        time.sleep(0.05)
    events = daemon.call("GET", "/v1/events", params={"limit": 1000})["events"]
    raise AssertionError(f"no matching event in {timeout} s; events: {events}")


def wait_for_job_event(
    daemon: Daemon, job_id: int, kind: str, timeout: float = 15
) -> dict[str, Any]:
    """The first event of `kind` about job `job_id`."""
    return wait_for_event(
        daemon, lambda e: e.get("job_id") == job_id and e["kind"] == kind, timeout
    )


def wait_gone(pid: int, timeout: float = 5) -> bool:
    """Whether process `pid` is gone within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while process_start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process_start_time(pid) is None


def pids_in(detail: str) -> list[int]:
    """The pids a finding names ("pid 12 (python3), 13 (sh)")."""
    return [int(pid) for pid in re.findall(r"(\d+) \(", detail)]
