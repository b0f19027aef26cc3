"""MIG jobs' starts: a plan over a device snapshot, an instance made or taken, the launch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from gpupool.agent.jobs import Job
from gpupool.agent.logs import about_job
from gpupool.agent.migchoice import MigChoice
from gpupool.agent.migjobs import MigJobs
from gpupool.agent.store import Store
from gpupool.core.errors import GpupoolError
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.launch import memory_bytes

#: the longest a queued MIG job waits for a new look at the GPUs' MIG layouts
MIG_REPLAN_S = 1.0


class MigScheduler:
    """Starts queued MIG jobs. A plan needs a device snapshot, so one is taken when a MIG job
    came or went, else at most every MIG_REPLAN_S (an admin may change the layout), not at every
    tick of the queue loop."""

    def __init__(
        self,
        mig: MigJobs,
        store: Store,
        read_gpus: Callable[[], NodeSnapshot],
        launch: Callable[[Job], None],
        fail: Callable[[Job, str], None],
    ) -> None:
        self.mig = mig
        self.store = store
        self._read_gpus = read_gpus
        self._launch = launch
        self._fail = fail
        self._changed = True
        self._planned_at = 0.0
        self._waiting: dict[int, tuple[str, ...]] = {}

    def changed(self) -> None:
        """A MIG job came: plan again at the next pass."""
        self._changed = True

    def schedule(self, queued: list[Job]) -> dict[int, tuple[str, ...]]:
        """Start what a plan allows of `queued` (MIG jobs only); why each other one waits."""
        now = time.monotonic()
        if not self._changed and now - self._planned_at < MIG_REPLAN_S:
            return self._waiting
        self._changed, self._planned_at = False, now
        choices, self._waiting = self.mig.plan(queued, self._read_gpus())
        for choice in choices:
            self._start(choice)
        return self._waiting

    def _start(self, choice: MigChoice) -> None:
        try:
            use = self.mig.acquire(choice)
        except GpupoolError as err:
            self._fail(choice.job, f"cannot make its MIG instance: {err}")
            return
        how = "created" if use.created else "free"
        # the share inside the instance, or all of it
        memory = memory_bytes(choice.job.spec.memory_share(), use.memory_total)
        job = self.store.start(
            choice.job, (use.gpu,), (memory or use.memory_total,), f"{use.label} ({how})"
        )
        try:
            self._launch(replace(job, mig=use))
        except Exception as err:  # any failure fails this job alone
            if not isinstance(err, GpupoolError | OSError):  # not an expected way: a bug
                about_job(job).exception("launch failed")
            self._fail(job, f"launch failed: {err}")
            self.release(job.id)

    def ended(self, job_id: int) -> None:
        """A MIG job ended: its instance goes back, and the next pass plans again."""
        self.release(job_id)
        self._changed = True

    def release(self, job_id: int) -> None:
        released = self.mig.release(job_id)
        if released is not None:
            self.store.note(job_id, "mig", released)
