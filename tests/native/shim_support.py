"""Helpers for the interception library's tests: a simulated node, the client program, its env.

The tests run real processes on the simulated CUDA driver with the real interception library
preloaded, as `gpupool exec` does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.units import GiB
from gpupool.devices.sim.state import SimGpuSpec, SimState
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    Registration,
    prepare_dir,
    start_arbiter,
)
from gpupool.isolation.libraries import native_libraries

REPO = Path(__file__).resolve().parents[2]
PROGS = Path(__file__).resolve().parent / "progs"
INCLUDE = REPO / "native" / "include"

# variables of the caller's environment that would change what the library or the driver does
_SCRUB = ("GPUPOOL_", "LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")


def compile_prog(source: Path, out: Path, *extra: str) -> Path:
    """Compile one test program against our CUDA header."""
    gcc = shutil.which("gcc")
    assert gcc is not None, "the native tests need gcc"
    subprocess.run(
        [
            gcc,
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
            f"-I{INCLUDE}",
            "-o",
            str(out),
            str(source),
            *extra,
            "-ldl",
        ],
        check=True,
    )
    return out


def make_node(
    directory: Path, memory: int = 80 * GiB, gpus: int = 1, uuids: Sequence[str] = ()
) -> Path:
    """A simulated node of `gpus` identical GPUs, with the given UUIDs or fresh ones."""
    directory.mkdir(parents=True, exist_ok=True)
    names = list(uuids) or [f"GPU-{uuid.uuid4()}" for _ in range(gpus)]
    specs = [
        SimGpuSpec(
            uuid=names[i],
            name="NVIDIA H100 80GB HBM3",
            model="H100-80GB",
            memory_total=memory,
            sm_count=132,
            cc_major=9,
            cc_minor=0,
            pci_bus_id=f"00000000:{0x17 + i:02x}:00.0",
        )
        for i in range(gpus)
    ]
    SimState.create(directory / "state.bin", specs).close()
    return directory


def shim_env(node: Path, **gpupool: str) -> dict[str, str]:
    """The environment of a workload on `node` with the library preloaded and GPUPOOL_* given
    as keyword arguments (MEMORY_LIMIT="1GiB" -> GPUPOOL_MEMORY_LIMIT=1GiB)."""
    libs = native_libraries()
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env["LD_PRELOAD"] = str(libs.shim)
    env["LD_LIBRARY_PATH"] = str(libs.sim_dir)
    env["GPUPOOL_SIM_NODE"] = str(node)
    env.update({f"GPUPOOL_{name}": value for name, value in gpupool.items()})
    return env


def log_prefix(pid: int) -> str:
    """How the libraries begin each line they write to stderr."""
    return f"gpupool[{pid}]: "


@dataclass
class Result:
    """A finished client run: its pid, exit status, output lines by step, stderr lines."""

    pid: int
    returncode: int
    lines: list[list[str]]
    stderr: list[str]

    def step(self, name: str) -> list[list[str]]:
        return [line[1:] for line in self.lines if line and line[0] == name]

    @property
    def prefix(self) -> str:
        """The client's own log prefix (`exec` steps keep the pid)."""
        return log_prefix(self.pid)

    def gpupool_lines(self) -> list[str]:
        """The libraries' lines, whichever process wrote them."""
        return [line for line in self.stderr if line.startswith("gpupool[")]


def run_client(
    client: Path, env: Mapping[str, str], *steps: str | int, timeout: float = 60
) -> Result:
    with subprocess.Popen(
        [str(client), *map(str, steps)],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return Result(
        proc.pid,
        proc.returncode,
        [line.split() for line in stdout.splitlines()],
        stderr.splitlines(),
    )


def start_client(client: Path, env: Mapping[str, str], *steps: str | int) -> subprocess.Popen[str]:
    """A client left running (for steps that wait: `ready`, `hold`)."""
    return subprocess.Popen(
        [str(client), *map(str, steps)],
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until(proc: subprocess.Popen[str], word: str) -> list[list[str]]:
    """Output lines of a running client up to (and with) the line starting with `word`."""
    assert proc.stdout is not None
    lines: list[list[str]] = []
    while True:
        line = proc.stdout.readline()
        assert line, f"the client ended before printing {word!r}"
        lines.append(line.split())
        if lines[-1][0] == word:
            return lines


def codes(result: Result, step: str) -> list[int]:
    """The CUresult of every `step` line."""
    return [int(fields[0]) for fields in result.step(step)]


@contextmanager
def arbiter(directory: Path) -> Iterator[tuple[ArbiterControl, int]]:
    """The trusted compute arbiter running in `directory`: a control connection and its pid;
    killed afterwards."""
    prepare_dir(directory)
    pid = start_arbiter(directory, directory.parent / "arbiter.log")
    control = ArbiterControl(directory)
    try:
        yield control, pid
    finally:
        control.close()
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def register(
    control: ArbiterControl,
    gpu_uuid: str,
    percent: int,
    policy: str = "cap",
    priority: str | None = None,
) -> dict[str, str]:
    """Register a share of this user on `gpu_uuid`; the GPUPOOL_* keywords of shim_env that
    make a process of it (ARBITER_DIR, ARBITER_SHARE)."""
    share = ArbiterShare.new()
    control.register(Registration(share, os.getuid(), (gpu_uuid,), percent, priority, policy))
    return {"ARBITER_DIR": str(control.directory), "ARBITER_SHARE": share.setting}


def gpu_uuid(node: Path, index: int = 0) -> str:
    """The UUID of GPU `index` of the simulated node at `node`."""
    state = SimState.open(node / "state.bin")
    try:
        return state.gpu(index).uuid
    finally:
        state.close()
