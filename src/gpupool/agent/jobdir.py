"""A job's directory under the state dir: launch file, claim, pids, exit status, output logs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.devices.procfs import process_start_time

#: the line the interception library writes when it refuses an allocation past the share
OOM_MARKER = b"gpupool: out of memory"


@dataclass(frozen=True)
class Pids:
    supervisor: int
    supervisor_start: int
    job: int
    job_start: int


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int
    at: float


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def alive(pid: int, start: int) -> bool:
    """True when `pid` is the same process that had start time `start` (not a reused pid)."""
    return process_start_time(pid) == start


@dataclass(frozen=True)
class JobDir:
    path: Path

    @property
    def launch_file(self) -> Path:
        return self.path / "launch.json"

    @property
    def stdout(self) -> Path:
        return self.path / "stdout"

    @property
    def stderr(self) -> Path:
        return self.path / "stderr"

    def log(self, stream: str) -> Path:
        return self.stderr if stream == "stderr" else self.stdout

    def write_launch(self, launch: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / "launch.json.tmp"
        tmp.write_text(json.dumps(launch))
        os.replace(tmp, self.launch_file)

    def claim(self) -> bool:
        """Take the launch for ourselves (True), or learn that a supervisor has it (False)."""
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path / "claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def claimant(self) -> int | None:
        """The pid of the supervisor that claimed the job (its session id), known before
        `pids.json` is; None when unclaimed, or claimed by a daemon checking for a cut launch."""
        try:
            return int((self.path / "claim").read_text())
        except (OSError, ValueError):
            return None

    def unclaim(self) -> None:
        (self.path / "claim").unlink(missing_ok=True)

    def pids(self) -> Pids | None:
        data = _read_json(self.path / "pids.json")
        if data is None:
            return None
        return Pids(data["supervisor"], data["supervisor_start"], data["job"], data["job_start"])

    def exit_status(self) -> ExitStatus | None:
        data = _read_json(self.path / "exit.json")
        if data is None:
            return None
        return ExitStatus(int(data["exit_code"]), float(data["at"]))

    def saw_oom(self) -> bool:
        """Whether the shim refused an allocation (its one line is in the job's stderr)."""
        try:
            with self.stderr.open("rb") as err:
                return any(OOM_MARKER in line for line in err)
        except OSError:
            return False
