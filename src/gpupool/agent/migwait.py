"""A blocked MIG job is not starved by later ones: the MIG side of the queue's backfill rule.

MIG jobs are taken in queue order (`high` before `low`, then by submission). A job that cannot
start now blocks. A later job may still take a free instance that exists, or create one, but not
where that would delay a blocked job ahead of it: it must not create an instance on a GPU where
the blocked job could be placed once the jobs running there now have ended, unless the blocked
job could still be placed there beside the new instance. When they end, the instances the daemon
made for them go and the others (an admin's, or kept by `--mig-keep-instances`) stay, free.

Jobs behind the blocked one that started since it was submitted (backfills, in this pass or an
earlier one) count as staying: otherwise a stream of small jobs, each leaving room beside itself
but overlapping the next, could keep the blocked job waiting forever. So a blocked job waits only
for what ran before it was submitted and for jobs ahead of it, as in agent/queue.py. Whether a
job could be placed is the planner's answer (`mig.addition`), never a second copy of its rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.agent.jobs import Job, queue_order
from gpupool.core.errors import MigLayoutError
from gpupool.mig.addition import best_addition
from gpupool.mig.catalog import GpuModel
from gpupool.mig.planner import Placement


@dataclass(frozen=True)
class Holder:
    """The job an instance serves: its place in the queue, and when it started (inf: in this
    pass)."""

    order: tuple[int, int]
    started: float

    @classmethod
    def of(cls, job: Job) -> Holder:
        started = job.started_at if job.started_at is not None else math.inf
        return cls(queue_order(job), started)

    def backfilled_past(self, blocked: Job) -> bool:
        """Behind `blocked` in the queue and started since it was submitted."""
        return self.order > queue_order(blocked) and self.started >= blocked.submitted_at


@dataclass
class Slot:
    """One instance on a GPU, and what becomes of it when its job ends."""

    placement: Placement
    uuid: str | None
    holder: Holder | None
    #: destroyed when its holder ends (the daemon made it and does not keep it)
    goes: bool


@dataclass
class MigGpu:
    """A GPU in MIG mode whose instances' placements are known, as the fairness rule sees it."""

    #: the snapshot's model name, as `--gpu-model` names it
    name: str
    model: GpuModel
    slots: list[Slot]


@dataclass
class Fairness:
    """The blocked jobs of one planning pass and the instances they wait for."""

    gpus: dict[int, MigGpu]
    #: the destroy-at-end of an instance made in this pass (False with --mig-keep-instances)
    made_go: bool
    blocked: list[Job] = field(default_factory=list)
    #: _could_place's answers by (GPU, blocked job, new placement): a pass asks the same ones
    #: for every later job, and only `hold` changes them
    answers: dict[tuple[int, int, Placement | None], bool] = field(default_factory=dict)

    def block(self, job: Job) -> None:
        self.blocked.append(job)

    def hold(self, job: Job, gpu: int, placement: Placement, uuid: str | None) -> None:
        """`job` starts in this pass on the instance `uuid`, or on a new one at `placement`."""
        mig_gpu = self.gpus.get(gpu)
        if mig_gpu is None:  # layout unknown: nothing is created there, nothing to protect
            return
        self.answers.clear()
        holder = Holder(queue_order(job), math.inf)
        found = next((s for s in mig_gpu.slots if uuid is not None and s.uuid == uuid), None)
        if found is not None:
            found.holder = holder
        else:
            mig_gpu.slots.append(Slot(placement, uuid, holder, self.made_go))

    def delayed_by(self, gpu: int, new: Placement) -> int | None:
        """The id of a blocked job that a new instance at `new` on `gpu` would delay, or None."""
        mig_gpu = self.gpus[gpu]
        for job in self.blocked:
            profile = job.spec.mig_profile
            assert profile is not None
            if job.spec.gpu_models and mig_gpu.name not in job.spec.gpu_models:
                continue
            if not mig_gpu.model.has_profile(profile):
                continue
            if self._fits_later(gpu, job, None) and not self._fits_later(gpu, job, new):
                return job.id
        return None

    def _fits_later(self, gpu: int, job: Job, new: Placement | None) -> bool:
        """`_could_place`, beside `new` if given, answered once per pass and hold."""
        key = (gpu, job.id, new)
        if key not in self.answers:
            beside = () if new is None else (new,)
            assert job.spec.mig_profile is not None
            fits = _could_place(self.gpus[gpu], job, job.spec.mig_profile, beside)
            self.answers[key] = fits
        return self.answers[key]


def _could_place(gpu: MigGpu, job: Job, profile: str, beside: Sequence[Placement]) -> bool:
    """Could `job` get a `profile` instance on `gpu` (with `beside` added) once the jobs on it
    have ended, but for those backfilled past it?"""
    staying = []
    for slot in gpu.slots:
        stays_held = slot.holder is not None and slot.holder.backfilled_past(job)
        if stays_held:
            staying.append(slot.placement)
        elif not slot.goes:
            if slot.placement.profile == profile:
                return True  # free by then, whatever is added beside it
            staying.append(slot.placement)
    try:
        best_addition(gpu.model, [*staying, *beside], profile)
    except MigLayoutError:
        return False
    return True
