"""The node daemon's MPS jobs: which server each job is a client of, and MPS's failure mode.

One fatal fault in a client takes down every client of that GPU's MPS server; the agent asks
here which jobs lost their server (to fail them with the reason) and which control daemons no
running job uses any more (to quit them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpupool.agent import mps
from gpupool.agent.jobs import Job
from gpupool.core.resources import Mode


def server_died(server: mps.MpsServer) -> str:
    return (
        f"its MPS server (pid {server.pid}) on GPU {server.gpu} died, "
        "failing every client of that server"
    )


class MpsJobs:
    """The per-GPU control daemons, and the MPS jobs' servers as their job directories record."""

    def __init__(self, control: mps.MpsControl, jobdir: Callable[[int], Path]) -> None:
        self.control = control
        self._jobdir = jobdir
        #: jobs whose server died, and why (their end is a failure whatever their exit code)
        self._failed: dict[int, str] = {}

    def _recorded(self, job: Job) -> mps.MpsServer | None:
        return mps.recorded(self._jobdir(job.id)) if job.spec.mode is Mode.MPS else None

    def lost_servers(self, running: Sequence[Job]) -> list[tuple[Job, str]]:
        """The running MPS jobs whose server died since the last look (each once, with why),
        after quitting the control daemons that no running job uses."""
        in_use: set[int] = set()
        lost = []
        for job in running:
            server = self._recorded(job)
            if job.spec.mode is Mode.MPS:
                in_use.update(job.gpus)
            if server is None or job.id in self._failed or server.alive():
                continue
            self._failed[job.id] = server_died(server)
            lost.append((job, self._failed[job.id]))
        for gpu in self.control.active_gpus():
            if gpu not in in_use:
                self.control.stop(gpu)
        return lost

    def failure(self, job: Job, code: int | None) -> str:
        """Why an ended MPS job failed with its server ('' when it did not)."""
        reason = self._failed.pop(job.id, "")
        server = self._recorded(job)
        if not reason and code != 0 and server is not None and not server.alive():
            reason = server_died(server)  # it failed before the loop saw the server go
        return reason

    def ended(self, job_id: int) -> None:
        """Forget a job that ended however it did (`failure` may not have been asked)."""
        self._failed.pop(job_id, None)

    def of_gpu(self, gpu: int, running: Sequence[Job]) -> dict[str, Any] | None:
        """A GPU's MPS server and its clients (job ids and pids), None when it has none."""
        server = None
        clients = []
        for job in running:
            recorded = self._recorded(job)
            if recorded is not None and recorded.gpu == gpu and recorded.alive():
                server = recorded.pid
                clients.append({"job": job.id, "pid": job.job_pid})
        return None if server is None else {"server": server, "clients": clients}

    def server_pid(self, job: Job) -> int | None:
        """The pid of the MPS server a job is (or was) a client of."""
        server = self._recorded(job)
        return server.pid if server is not None else None
