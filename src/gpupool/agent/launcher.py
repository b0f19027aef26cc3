"""Turn a placed job into a running one: its environment per mode, its directory, its supervisor.

The per-mode part is one small interface (`ModeLauncher.env`): `shim` builds exactly the launch
spec of `gpupool exec` (one accounting region per job, in the job's directory); `exclusive` gives
whole GPUs with no limits, only CUDA_VISIBLE_DEVICES; `mps` makes the job a client of its GPU's
MPS server (started on demand, agent/mps.py) with the shim's memory limit, no compute
arbitration (MPS provisions SMs, not time) and its priority as the MPS client priority; `mig`
is the shim's on the job's MIG instance.
"""

from __future__ import annotations

import logging
import os
import pwd
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpupool.agent import mps, supervisor
from gpupool.agent.arbiters import NodeArbiter
from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job, MigUse
from gpupool.agent.logs import about_job
from gpupool.core import settings
from gpupool.core.errors import DaemonError, GpupoolError
from gpupool.core.resources import Mode
from gpupool.core.units import MILLI_PER_GPU, MemoryShare
from gpupool.isolation.arbiter_control import Registration
from gpupool.isolation.launch import (
    ShareLimits,
    build_launch_spec,
    memory_bytes,
    new_shared_region,
)
from gpupool.isolation.libraries import sim_driver_dir
from gpupool.isolation.mps import mps_client_env
from gpupool.isolation.node import LaunchNode

_KEPT_VARIABLES = ("PATH", "LANG", "LC_ALL", "TZ")

log = logging.getLogger(__name__)


class ModeLauncher(Protocol):
    def env(
        self,
        job: Job,
        node: LaunchNode,
        jobdir: JobDir,
        base: Mapping[str, str],
        arbiter: NodeArbiter | None,
    ) -> dict[str, str]:
        """The job's whole environment for its mode."""


def _share_memory(job: Job) -> int | MemoryShare | None:
    """The limit the shim enforces: what admission reserved on each GPU."""
    if len(set(job.memory)) == 1:
        return job.memory[0]
    share = job.spec.memory_share()
    if share is not None:
        return share
    compute = job.spec.compute
    return None if compute >= MILLI_PER_GPU else MemoryShare(fraction=compute / MILLI_PER_GPU)


def _shim_env(
    job: Job,
    limits: ShareLimits,
    totals: Sequence[int | None],
    node: LaunchNode,
    jobdir: JobDir,
    base: Mapping[str, str],
    arbiter: NodeArbiter | None = None,
) -> dict[str, str]:
    """The interception library's launch of `job` under `limits` (the shim, mps and mig modes
    all enforce memory through it), its accounting region in the job's directory; a share with
    a compute limit or a priority registered with the node's arbiter first."""
    seat = None
    if arbiter is not None and limits.arbitrated:
        share = arbiter.share_of(f"job {job.id}")
        try:
            arbiter.register(limits.registration(share, job.uid, node.uuids))
            seat = (arbiter.directory, share)
        except GpupoolError as err:
            # the job still holds its cap, alone; its processes say so on its stderr
            about_job(job, log).warning("runs unarbitrated: %s", err)
    spec = build_launch_spec(
        job.spec.argv,
        limits,
        gpu_totals=totals,
        sim_node=node.sim_node,
        base_env=base,
        shared_region=new_shared_region(jobdir.path),
        arbiter=seat,
    )
    return dict(spec.env)


def _shim_limits(job: Job) -> ShareLimits:
    return ShareLimits(
        job.gpus,
        _share_memory(job),
        job.spec.compute,
        priority=job.spec.priority,
        slice_us=job.spec.slice_us,
    )


def _mig_limits(job: Job, mig: MigUse) -> ShareLimits:
    return ShareLimits(
        (mig.gpu,),
        job.spec.memory_share(),
        job.spec.compute,
        priority=job.spec.priority,
        mig_uuid=mig.uuid,
        slice_us=job.spec.slice_us,
    )


def arbiter_limits(job: Job) -> ShareLimits | None:
    """The share the arbiter holds a running job of mode shim or mig to; None for the others."""
    if job.spec.mode is Mode.SHIM:
        return _shim_limits(job)
    if job.spec.mode is Mode.MIG and job.mig is not None:
        return _mig_limits(job, job.mig)
    return None


def registrations(
    jobs: Sequence[Job], arbiter: NodeArbiter, node: LaunchNode
) -> list[Registration]:
    """What the arbiter holds the running jobs' shares to (registered again after its restart)."""
    found = []
    for job in jobs:
        limits = arbiter_limits(job)
        if limits is not None and limits.arbitrated:
            found.append(
                limits.registration(arbiter.share_of(f"job {job.id}"), job.uid, node.uuids)
            )
    return found


class ShimLauncher:
    def env(
        self,
        job: Job,
        node: LaunchNode,
        jobdir: JobDir,
        base: Mapping[str, str],
        arbiter: NodeArbiter | None,
    ) -> dict[str, str]:
        # the queue's priority is also the compute arbiter's: a low job runs on a GPU only in
        # the time high shares leave (root's `gpupool exec --priority` and jobs arbitrate together)
        limits = _shim_limits(job)
        env = _shim_env(job, limits, node.totals_of(job.gpus), node, jobdir, base, arbiter)
        # elastic memory: managed allocations, so that the job can be suspended and resumed,
        # and a low job's burst past its share
        env[settings.ELASTIC.name] = "1"
        if job.spec.memory_burst:
            env[settings.MEMORY_BURST.name] = str(job.spec.burst_bytes())
        return env


class ExclusiveLauncher:
    def env(
        self,
        job: Job,
        node: LaunchNode,
        jobdir: JobDir,
        base: Mapping[str, str],
        arbiter: NodeArbiter | None,
    ) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith("GPUPOOL_")}
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in job.gpus)
        if node.sim_node is not None:
            sim = str(sim_driver_dir())
            existing = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = f"{sim}:{existing}" if existing else sim
            env[settings.SIM_NODE.name] = str(node.sim_node)
        return env


class MpsLauncher:
    def __init__(self, control: mps.MpsControl) -> None:
        self.control = control

    def env(
        self,
        job: Job,
        node: LaunchNode,
        jobdir: JobDir,
        base: Mapping[str, str],
        arbiter: NodeArbiter | None,
    ) -> dict[str, str]:
        [gpu] = job.gpus
        # no compute limit and no priority for the shim: it neither throttles nor joins the
        # arbiter; the priority goes to MPS instead, as the client priority
        limits = ShareLimits(job.gpus, _share_memory(job))
        totals = node.totals_of(job.gpus)
        env = _shim_env(job, limits, totals, node, jobdir, base)
        memory = memory_bytes(limits.memory, totals[0])
        server = self.control.ensure_server(gpu, job.uid)
        mps.record(jobdir.path, server)
        pipe = self.control.pipe_dir(gpu)
        visible = self.control.visible(gpu)
        client = mps_client_env(pipe, visible, job.spec.compute, memory, job.spec.priority)
        return {**env, **client}


class MigLauncher:
    """The shim's launch on the job's MIG instance: CUDA_VISIBLE_DEVICES is its MIG-UUID, and a
    memory share (if asked) is enforced inside the instance, resolved against its memory."""

    def env(
        self,
        job: Job,
        node: LaunchNode,
        jobdir: JobDir,
        base: Mapping[str, str],
        arbiter: NodeArbiter | None,
    ) -> dict[str, str]:
        if job.mig is None:
            raise DaemonError(f"job {job.id} has no MIG instance to run on")
        limits = _mig_limits(job, job.mig)
        totals = [job.mig.memory_total]
        return _shim_env(job, limits, totals, node, jobdir, base, arbiter)


LAUNCHERS: dict[Mode, ModeLauncher] = {
    Mode.SHIM: ShimLauncher(),
    Mode.EXCLUSIVE: ExclusiveLauncher(),
    Mode.MIG: MigLauncher(),
}


def base_env(job: Job) -> dict[str, str]:
    """What every job starts from: a few of the daemon's variables, its user's, its own."""
    env = {k: os.environ[k] for k in _KEPT_VARIABLES if k in os.environ}
    try:
        entry = pwd.getpwuid(job.uid)
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    except KeyError:
        pass
    env.update(job.spec.env)
    return env


def _identity(uid: int) -> dict[str, Any]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return {"uid": uid, "gid": uid, "groups": [uid]}
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return {"uid": uid, "gid": entry.pw_gid, "groups": groups}


def launch(
    job: Job,
    node: LaunchNode,
    jobdir: JobDir,
    mps_control: mps.MpsControl,
    arbiter: NodeArbiter | None = None,
) -> None:
    """Write the job's launch file and start its supervisor (which starts the job, detached)."""
    jobdir.create()
    chosen = MpsLauncher(mps_control) if job.spec.mode is Mode.MPS else LAUNCHERS[job.spec.mode]
    env = chosen.env(job, node, jobdir, base_env(job), arbiter)
    identity = _identity(job.uid)
    if os.geteuid() == 0:
        # the job's own processes create its accounting region in there
        jobdir.hand_over_shares(identity["uid"], identity["gid"])
    jobdir.write_launch(
        {
            "argv": list(job.spec.argv),
            "env": env,
            "cwd": job.spec.workdir,
            "max_log_size": jobdir.max_log_size,
            **identity,
        }
    )
    try:
        # -S -E: the supervisor needs the standard library only, and no site's startup cost
        starter = subprocess.Popen(
            [sys.executable, "-S", "-E", supervisor.__file__, str(jobdir.path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as err:
        raise DaemonError(f"cannot start the supervisor of job {job.id}: {err}") from err
    starter.wait()  # it forks the supervisor and exits at once
