"""The daemon's settings, typed, with their defaults: what `gpupool serve`'s options set."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.agent.access import Access
from gpupool.agent.exempt import NO_EXEMPTIONS, Exemptions
from gpupool.agent.jobdir import MIN_LOG_SIZE
from gpupool.agent.watchdog import Action
from gpupool.core.errors import InvalidRequest
from gpupool.core.settings import DAEMON
from gpupool.scheduler.names import check_policy

#: `serve --preempt`
PREEMPT_MODES = ("none", "suspend")


@dataclass(frozen=True)
class AgentConfig:
    """The node daemon's settings (`gpupool serve` sets each from an option)."""

    state_dir: Path
    policy: str = DAEMON.policy
    cancel_grace_s: float = DAEMON.cancel_grace_s
    tick_s: float = 0.1
    sample_s: float = 1.0
    #: bytes set aside per job and GPU for what the share does not count (its CUDA context);
    #: None: node.DEFAULT_CONTEXT_RESERVE on real GPUs, nothing on a simulated node, whose
    #: driver charges a context nothing
    context_reserve: int | None = None
    #: what the watchdog does with a GPU process of no job or a job over its share
    watchdog: Action = Action.REPORT
    #: GPU processes of no job the watchdog reports as exempt and never kills
    watchdog_exempt: Exemptions = NO_EXEMPTIONS
    #: leave the MIG instances created for jobs in place after them
    mig_keep_instances: bool = False
    #: each job's stdout and stderr keep at most this many bytes, the newest (0: no limit)
    max_log_size: int = DAEMON.max_log_size
    #: who may act on whose jobs and drain the node (default: this process's user is the admin)
    access: Access = field(default_factory=lambda: Access(os.geteuid()))
    #: finished jobs, their events and directories are deleted this long after they finished
    keep_finished_s: float = DAEMON.keep_finished_s
    #: what a high job that does not fit does to low jobs: "none" (it waits), or "suspend"
    #: (suspends them to host memory; they resume, in queue order, when room returns)
    preempt: str = "none"
    #: bytes of host memory services' parked replicas may hold together; None: the share
    #: DAEMON.parked_memory_fraction of the host's memory
    parked_memory: int | None = None

    def __post_init__(self) -> None:
        if self.max_log_size and self.max_log_size < MIN_LOG_SIZE:
            raise InvalidRequest(
                f"invalid maximum log size {self.max_log_size} bytes (--max-log-size): "
                f"0 for no limit, or at least {MIN_LOG_SIZE // 1024}Ki"
            )
        if self.preempt not in PREEMPT_MODES:
            raise InvalidRequest(
                f"unknown preemption {self.preempt!r} (--preempt): use {' or '.join(PREEMPT_MODES)}"
            )
        check_policy(self.policy)
