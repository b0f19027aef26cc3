"""The node daemon's side of Slurm: it makes and ends the jobs' shares for the node's Prolog and
Epilog, with its own compute arbiter connection and its last GPU snapshot, so that a job's start
pays for one small request rather than for a process that loads gpupool and opens the GPUs."""

from __future__ import annotations

import os
import pwd
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from gpupool.agent.arbiters import NodeArbiter
from gpupool.core.errors import DaemonError, InvalidRequest
from gpupool.devices.procfs import process_uid
from gpupool.devices.snapshot import NodeSnapshot
from gpupool.isolation.arbiter_control import Registration
from gpupool.slurm import shares
from gpupool.slurm.gres import Gres


class Asked(NamedTuple):
    """What a job asked with the SPANK plugin's options (None: what its shards give)."""

    priority: str | None = None
    policy: str | None = None
    memory: str | None = None
    compute: str | None = None


@dataclass
class SlurmNode:
    """Where the jobs' shares go, and what holds them."""

    shares_dir: Path
    arbiter: NodeArbiter
    sim_node: Path | None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: each running share's terms at the arbiter, by Slurm job id: registered again when the
    #: arbiter is started again (NodeArbiter.also_keep)
    _held: dict[int, Registration] = field(default_factory=dict)
    #: its own lock: the arbiter asks for them while holding its lock, which `start` takes
    #: while holding `_lock`
    _held_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.arbiter.also_keep(self.registrations)

    def registrations(self) -> list[Registration]:
        with self._held_lock:
            return list(self._held.values())

    def start(
        self,
        job_id: int,
        uid: int,
        gres: Gres,
        shards_per_gpu: int,
        snapshot: NodeSnapshot | None,
        asked: Asked = Asked(),
    ) -> dict[str, object]:
        """Make job `job_id`'s share, narrowed to what it `asked`; {"share": ...}, or
        {"refused": why} when the node cannot hold it (its tasks then refuse to start, saying
        why)."""
        if snapshot is None:
            raise DaemonError("the daemon has not read its GPUs yet: try again")
        try:
            entry = pwd.getpwuid(uid)
        except KeyError as err:
            raise InvalidRequest(f"job {job_id}: no user of uid {uid} on this node") from err
        gpus = shares.node_gpus(snapshot)
        with self._lock:
            try:
                share = shares.share_of(job_id, entry.pw_name, uid, gres, gpus, shards_per_gpu)
                share = shares.narrowed(share, *asked)
            except InvalidRequest as err:
                shares.refuse(self.shares_dir, job_id, str(err))
                return {"refused": str(err)}
            share, held = shares.write_share(
                self.shares_dir, share, entry.pw_gid, gpus, self.arbiter, self.sim_node
            )
            if held is not None:
                with self._held_lock:
                    self._held[job_id] = held
        return {"share": share.to_json()}

    def end(self, job_id: int) -> bool:
        with self._lock:
            with self._held_lock:
                self._held.pop(job_id, None)
            return shares.end_share(self.shares_dir, job_id, self.arbiter)

    def holder(self, pid: int) -> str | None:
        """`slurm job N` when process `pid` is a task of job N as the SPANK plugin made it:
        in the host's user namespace (where only root mounts), with job N's files over its
        /etc, run by the job's user; else None (the watchdog's process of no job)."""
        try:
            if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
                return None
            uid = process_uid(pid)  # /proc/PID's owner is root's while the process is not dumpable
            mounts = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            return None
        prefix = re.escape(f"lowerdir={self.shares_dir}/")
        found = re.search(rf"{prefix}(\d+)/etc:/etc(?:,|$)", mounts, re.MULTILINE)
        share = shares.read_share(self.shares_dir / found.group(1)) if found else None
        if share is None or share.uid != uid:
            return None
        return f"slurm job {share.slurm_job_id}"

    def listing(self) -> list[dict[str, object]]:
        return [share.to_json() for share in shares.list_shares(self.shares_dir)]
