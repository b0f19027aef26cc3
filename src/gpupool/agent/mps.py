"""MPS control: one control daemon per GPU for the daemon's `--mode mps` jobs, and their servers.

A GPU's control daemon starts when the first MPS job lands there and quits when the last one
leaves. Its pipe and log directories live under the state dir (STATE/mps/<index>/pipe and .../log),
never the system default, so it serves only the jobs gpupool points at it, and it sees only its
GPU (CUDA_VISIBLE_DEVICES = the GPU's UUID). It is driven as an admin drives it: the control
program with `-d`, then commands on the stdin of a client invocation. On a simulated node the
program is gpupool's twin (devices/sim/mps_twin.py) unless GPUPOOL_MPS_CONTROL names another.

Everything this module knows lives in those directories and the control daemon itself, so a
restarted daemon finds its control daemons and servers again by asking them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.jobdir import alive
from gpupool.core import settings
from gpupool.core.errors import DeviceError
from gpupool.devices.procfs import process_start_time, process_uid
from gpupool.devices.sim import mps_twin

REAL_CONTROL = "nvidia-cuda-mps-control"
_ANSWER_TIMEOUT_S = 10.0
_START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MpsServer:
    """An MPS server as a job records it: pid and start time (a reused pid is not it)."""

    gpu: int
    pid: int
    start: int

    def alive(self) -> bool:
        return alive(self.pid, self.start)


RECORD_FILE = "mps_server.json"


def record(jobdir: Path, server: MpsServer) -> None:
    """Note in the job's directory which server it is a client of (it outlives the daemon)."""
    data = {"gpu": server.gpu, "pid": server.pid, "start": server.start}
    (jobdir / RECORD_FILE).write_text(json.dumps(data))


def recorded(jobdir: Path) -> MpsServer | None:
    """The server a job was launched as a client of, if it is an MPS job."""
    try:
        data = json.loads((jobdir / RECORD_FILE).read_text())
        return MpsServer(int(data["gpu"]), int(data["pid"]), int(data["start"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def control_command(simulated: bool, environ: dict[str, str] | None = None) -> list[str]:
    """The control program: GPUPOOL_MPS_CONTROL, else the twin on a simulated node, else
    NVIDIA's."""
    named = settings.MPS_CONTROL.read(os.environ if environ is None else environ)
    if named:
        return named.split()
    return mps_twin.command() if simulated else [REAL_CONTROL]


class MpsControl:
    """The control daemons of one node, by GPU index."""

    def __init__(self, root: Path, command: Sequence[str], uuids: Sequence[str | None]) -> None:
        self.root = root
        self.command = list(command)
        self.uuids = list(uuids)

    def pipe_dir(self, gpu: int) -> Path:
        return self.root / str(gpu) / "pipe"

    def log_dir(self, gpu: int) -> Path:
        return self.root / str(gpu) / "log"

    def env(self, gpu: int) -> dict[str, str]:
        """The control daemon's environment: its directories and its one GPU."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_"))}
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir(gpu))
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir(gpu))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = self.visible(gpu)
        return env

    def visible(self, gpu: int) -> str:
        """How clients and the control daemon name the GPU: its UUID means the same to both."""
        uuid = self.uuids[gpu] if gpu < len(self.uuids) else None
        return uuid or str(gpu)

    def active_gpus(self) -> list[int]:
        """GPUs whose control daemon was started and not stopped."""
        if not self.root.is_dir():
            return []
        return sorted(
            int(entry.name)
            for entry in self.root.iterdir()
            if entry.name.isdigit() and (entry / "pipe").is_dir()
        )

    def ask(self, gpu: int, *commands: str) -> str | None:
        """The control daemon's answers to `commands`, or None when none answers."""
        # a running control daemon has its `control` pipe (the twin: socket) in its directory;
        # without it, a client invocation would only say it found no daemon
        if not (self.pipe_dir(gpu) / "control").exists():
            return None
        try:
            done = subprocess.run(
                self.command,
                input="".join(f"{c}\n" for c in commands),
                capture_output=True,
                text=True,
                env=self.env(gpu),
                timeout=_ANSWER_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    def log_tail(self, gpu: int) -> str:
        """The last words of the control daemon's log, for a one-line error."""
        try:
            lines = (self.log_dir(gpu) / "control.log").read_text().strip().splitlines()
        except OSError:
            return "no control.log"
        return lines[-1] if lines else "control.log is empty"

    def servers(self, gpu: int) -> list[int] | None:
        answer = self.ask(gpu, "get_server_list")
        if answer is None:
            return None
        return [int(word) for word in answer.split() if word.isdigit()]

    def _start_control(self, gpu: int) -> None:
        self.pipe_dir(gpu).mkdir(parents=True, exist_ok=True, mode=0o755)
        self.log_dir(gpu).mkdir(parents=True, exist_ok=True)
        try:
            started = subprocess.run(
                [*self.command, "-d"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env(gpu),
                timeout=_START_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            self.stop(gpu)
            program = self.command[0]
            raise DeviceError(f"cannot run the MPS control program {program}: {err}") from err
        deadline = time.monotonic() + _START_TIMEOUT_S
        while self.servers(gpu) is None:
            if started.returncode != 0 or time.monotonic() > deadline:
                tail = self.log_tail(gpu)
                self.stop(gpu)
                raise DeviceError(f"the MPS control daemon of GPU {gpu} did not start: {tail}")
            time.sleep(0.05)

    def ensure_server(self, gpu: int, uid: int) -> MpsServer:
        """The GPU's MPS server for `uid`, starting its control daemon and server as needed."""
        if self.servers(gpu) is None:
            self._start_control(gpu)
        before = set(self.servers(gpu) or [])
        self.ask(gpu, f"start_server -uid {uid}")
        pids = self.servers(gpu) or []
        # the new server, else the one already serving (one server per user at a time)
        fresh = [pid for pid in pids if pid not in before] or pids
        start = process_start_time(fresh[0]) if fresh else None
        if start is None:
            tail = self.log_tail(gpu)
            if not before:
                self.stop(gpu)
            raise DeviceError(f"the MPS server of GPU {gpu} did not start: {tail}")
        owner = process_uid(fresh[0])
        if owner is not None and owner != uid and os.geteuid() == 0:
            raise DeviceError(
                f"GPU {gpu}'s MPS server (pid {fresh[0]}) runs for uid {owner}: MPS serves one "
                "user per GPU at a time; run this job when that user's MPS jobs there are done"
            )
        return MpsServer(gpu, fresh[0], start)

    def stop(self, gpu: int) -> None:
        """Quit the GPU's control daemon (its servers with it) and remove its pipe directory;
        the log stays for a post-mortem."""
        if self.ask(gpu, "quit") is not None:
            deadline = time.monotonic() + _START_TIMEOUT_S
            while self.servers(gpu) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.pipe_dir(gpu))
