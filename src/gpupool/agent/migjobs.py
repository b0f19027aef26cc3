"""MIG jobs in the node daemon: admission, the instance each job gets, and cleaning up after.

A MIG job asks for a profile (`1g.10gb`). It gets a free instance of that profile when the node
has one (an instance no running job uses); otherwise the daemon creates one on a GPU already in
MIG mode, where the planner says it strands the fewest memory slices (`mig.addition`). The
daemon never switches a GPU's MIG mode: that is an admin's step, and a job that needs it is
refused with the command to run. Instances the daemon created are destroyed when their job ends
(unless `gpupool serve --mig-keep-instances`); the store notes an instance before it is created,
so a daemon killed at any moment finds, at restart, every instance it made and either re-adopts
it (its job still runs) or destroys it.

Queued MIG jobs are placed in queue order (`high` before `low`, then by submission). One that
cannot be placed now blocks: a later job may still take a free instance or create one, but never
an instance that would delay the blocked job, i.e. on a GPU where it could go once the jobs
running there now have ended (and the instances the daemon made for them are gone) but could not
go beside the new instance. That job waits, saying so ("it fits now, but would delay job N queued
ahead of it"). The rule, and why backfills past a blocked job count as staying, is in
`agent/migwait.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from gpupool.agent.jobs import Job, JobSpec, MigUse, State
from gpupool.agent.migchoice import (
    MigChoice,
    PlacingGpu,
    choose,
    enable_hint,
    gpus_for,
    instances_on,
    model_of,
    profile_of,
    take,
)
from gpupool.agent.migwait import Fairness, Holder, MigGpu, Slot
from gpupool.agent.store import Store
from gpupool.core.errors import (
    DeviceError,
    GpupoolError,
    InvalidRequest,
    MigLayoutError,
    Unschedulable,
)
from gpupool.devices.backend import GpuBackend
from gpupool.devices.snapshot import MigInstance, NodeSnapshot
from gpupool.mig.addition import best_addition
from gpupool.mig.planner import Placement


class MigJobs:
    """The MIG side of admission and placement; its own instances, through the store."""

    def __init__(self, store: Store, backend: GpuBackend, lock: threading.Lock, keep: bool):
        self.store = store
        self.backend = backend
        self.lock = lock  # the agent's backend lock: one NVML (or node file) user at a time
        self.keep = keep

    # -- submit -------------------------------------------------------------------------------

    def check_submit(self, spec: JobSpec, snapshot: NodeSnapshot) -> JobSpec:
        """The spec with its profile's canonical name, or one line saying why it never fits."""
        assert spec.mig_profile is not None
        gpus = gpus_for(snapshot, set(), spec)
        profile = profile_of(gpus, spec.mig_profile)
        able = [g for g in gpus if g.model is not None and g.model.has_profile(profile)]
        on = [g for g in able if g.mig_on]
        if not on:
            where = ", ".join(str(g.index) for g in able)
            raise Unschedulable(
                f"MIG profile {profile} needs a GPU in MIG mode; GPU {where} could take it but "
                f"MIG mode is off: {enable_hint(able)}"
            )
        ours = {use.uuid for use in self.store.mig_uses().values() if use.created}
        reasons = []
        for gpu in on:
            assert gpu.model is not None
            instances = [i for i in instances_on(snapshot, gpu.index) if i.uuid not in ours]
            if any(i.profile == profile for i in instances):
                return replace(spec, mig_profile=profile)
            if not gpu.placements_known:
                reasons.append(f"GPU {gpu.index}: its layout is unknown (NVML tells it to root)")
                continue
            layout = [Placement(i.placement_start or 0, i.profile) for i in instances]
            try:
                best_addition(gpu.model, layout, profile)
            except MigLayoutError as err:
                reasons.append(f"GPU {gpu.index}: {err}")
                continue
            return replace(spec, mig_profile=profile)
        raise Unschedulable(
            f"MIG profile {profile} fits nowhere on this node: {'; '.join(reasons)}"
        )

    # -- the queue ----------------------------------------------------------------------------

    def plan(
        self, queued: Sequence[Job], snapshot: NodeSnapshot
    ) -> tuple[list[MigChoice], dict[int, tuple[str, ...]]]:
        """Where each queued MIG job goes now, in queue order, and why not for the rest; a later
        job never delays a blocked one ahead of it (agent/migwait.py)."""
        uses = self.store.mig_uses()
        in_use = {use.uuid for use in uses.values()}
        fairness = self._fairness(snapshot, uses)
        layouts: dict[tuple[str, ...], list[PlacingGpu]] = {}
        choices: list[MigChoice] = []
        waiting: dict[int, tuple[str, ...]] = {}
        for job in queued:
            # GPUs filtered per model set; the placements of this pass are shared by index
            key = job.spec.gpu_models
            if key not in layouts:
                layouts[key] = gpus_for(snapshot, in_use, job.spec)
            gpus = layouts[key]
            choice, why = choose(job, gpus, fairness)
            if choice is None:
                waiting[job.id] = why
                fairness.block(job)
                continue
            choices.append(choice)
            uuid = choice.existing.uuid if choice.existing is not None else None
            fairness.hold(job, choice.gpu, Placement(choice.start, choice.profile), uuid)
            for others in layouts.values():  # the same GPU seen through other model filters
                for gpu in others:
                    if gpu.index == choice.gpu:
                        take(gpu, choice)
        return choices, waiting

    def _fairness(self, snapshot: NodeSnapshot, uses: dict[int, MigUse]) -> Fairness:
        """The instances of the GPUs where new ones can be made, with the jobs holding them."""
        running = {job.id: job for job in self.store.jobs([State.RUNNING])}
        held: dict[str, tuple[Holder, bool]] = {}
        for job_id, use in uses.items():
            job = running.get(job_id) or self.store.job(job_id)
            held[use.uuid] = (Holder.of(job), use.created and not self.keep)
        gpus = {}
        for gpu in snapshot.gpus:
            model = model_of(gpu)
            if model is None or gpu.mig is None or not gpu.mig.current:
                continue
            slots = []
            for instance in gpu.mig.instances:
                if instance.placement_start is None:  # no new instance is made on this GPU
                    break
                holder, goes = held.get(instance.uuid or "", (None, False))
                placement = Placement(instance.placement_start, instance.profile)
                slots.append(Slot(placement, instance.uuid, holder, goes))
            else:
                gpus[gpu.index] = MigGpu(gpu.model, model, slots)
        return Fairness(gpus, made_go=not self.keep)

    def acquire(self, choice: MigChoice) -> MigUse:
        """The chosen instance, created when it is a new one (noted in the store first)."""
        job, found = choice.job, choice.existing
        if found is not None:
            assert found.uuid is not None
            use = MigUse(
                choice.gpu, found.gi_id, found.profile, choice.start, found.uuid,
                found.memory_total, created=False,
            )  # fmt: skip
            self.store.mig_assign(job.id, use)
            return use
        self.store.mig_intend(job.id, choice.gpu, choice.profile, choice.start)
        try:
            with self.lock:
                made = self.backend.create_gpu_instance(choice.gpu, choice.profile, choice.start)
        except GpupoolError:
            # a driver may fail half-way (the GPU instance made, its compute instance not)
            self._destroy_unclaimed(choice.gpu, choice.profile, choice.start)
            self.store.mig_forget(job.id)
            raise
        # NVML names a new instance's UUID only through its MIG device handle: a fresh look
        uuid = made.uuid or next(
            (i.uuid for i in self._instances_now(choice.gpu) if i.gi_id == made.gi_id), None
        )
        if uuid is None:  # an instance CUDA cannot be pointed at is of no use to the job
            self._destroy(choice.gpu, made.gi_id)
            self.store.mig_forget(job.id)
            raise DeviceError(f"GPU {choice.gpu}: the new {choice.profile} instance has no UUID")
        use = MigUse(
            choice.gpu, made.gi_id, made.profile, choice.start, uuid, made.memory_total,
            created=True,
        )  # fmt: skip
        self.store.mig_assign(job.id, use)
        return use

    def release(self, job_id: int) -> str | None:
        """After a job: destroy the instance made for it (unless kept); what happened, if any."""
        use = self.store.mig_uses().get(job_id)
        if use is None:
            self.store.mig_forget(job_id)
            return None
        detail = f"{use.label} freed"
        if use.created and not self.keep:
            detail = self._destroy_made(use)
        elif use.created:
            detail = f"{use.label} kept for the next job (--mig-keep-instances)"
        self.store.mig_release(job_id)
        return detail

    # -- restart ------------------------------------------------------------------------------

    def recover(self) -> list[tuple[int, str]]:
        """Re-adopt the instances of running jobs; destroy the ones made for jobs that are not
        running any more, or half-made when the last daemon died. (job id, what was done)."""
        running = {job.id for job in self.store.jobs([State.RUNNING])}
        done = []
        for job_id, use, (gpu, profile, start) in self.store.mig_rows():
            if use is not None and job_id in running:
                done.append((job_id, f"{use.label} re-adopted"))
                continue
            if use is None:
                # created (or not) before the daemon died
                detail = self._destroy_unclaimed(gpu, profile, start)
                if detail is not None:
                    done.append((job_id, detail))
                self.store.mig_forget(job_id)
                continue
            detail = self.release(job_id)
            if detail is not None:
                done.append((job_id, detail))
        return done

    # -- helpers ------------------------------------------------------------------------------

    def _instances_now(self, gpu: int) -> tuple[MigInstance, ...]:
        """The GPU's instances from a fresh snapshot: the ones of the daemon's last look may be
        gone since, and a GPU instance id, once free, names the next instance made."""
        with self.lock:
            return instances_on(self.backend.snapshot(), gpu)

    def _destroy_made(self, use: MigUse) -> str:
        """Destroy the instance the daemon made for a job, found by its UUID."""
        made = next((i for i in self._instances_now(use.gpu) if i.uuid == use.uuid), None)
        if made is None:
            return f"{use.label} already gone"
        return self._destroy_or_say(use.gpu, made.gi_id, use.label)

    def _destroy_unclaimed(self, gpu: int, profile: str, start: int) -> str | None:
        """Destroy the instance of `profile` at `start` that no job holds: one the daemon was
        making when it failed or died. What was done, if anything."""
        claimed = {use.uuid for use in self.store.mig_uses().values()}
        for instance in self._instances_now(gpu):
            if (instance.profile, instance.placement_start) == (profile, start) and (
                instance.uuid not in claimed
            ):
                label = f"mig:{profile}@{gpu}/{instance.gi_id}"
                return self._destroy_or_say(gpu, instance.gi_id, label)
        return None

    def _destroy(self, gpu: int, gi_id: int) -> None:
        with self.lock:
            self.backend.destroy_gpu_instance(gpu, gi_id)

    def _destroy_or_say(self, gpu: int, gi_id: int, label: str) -> str:
        try:
            self._destroy(gpu, gi_id)
        except (DeviceError, InvalidRequest) as err:
            return f"{label} could not be destroyed: {err}"
        return f"{label} destroyed"
