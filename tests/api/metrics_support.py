"""A busy agent for the /metrics collector's tests: jobs in the store, their shares' regions."""

from __future__ import annotations

import sys
from pathlib import Path

from gpupool.agent.agent import Agent
from gpupool.agent.jobs import Job, JobSpec
from gpupool.agent.usage import Usage
from gpupool.core.resources import Mode, Priority
from gpupool.isolation import region
from gpupool.isolation.launch import new_shared_region

#: a name and a user with every character the text format escapes, and some it does not (a
#: job's name is printable: the newline is in the user's)
ODD_NAME = 'say "hi" \\ to the ünïcode job'
ODD_USER = 'o"brien\\\nx'


def write_region(path: Path, counters: list[tuple[int, int, int]]) -> None:
    data = bytearray(region.FILE_SIZE)
    region.HEADER.pack_into(data, 0, region.MAGIC, region.VERSION, region.FILE_SIZE, 7)
    for device, values in enumerate(counters):
        region.COUNTERS.pack_into(
            data, region.COUNTERS_OFFSET + device * region.COUNTERS.size, *values
        )
    path.write_bytes(bytes(data))


def start_shared_job(
    agent: Agent, spec: JobSpec, user: str, gpus: list[int], counters: list[tuple[int, int, int]]
) -> Job:
    """A job running on `gpus` as the daemon starts one, its region holding `counters` (refused,
    cap_wait_ns, lease_wait_ns per device) as the library would have counted them."""
    store = agent.store
    job = store.start(store.add(spec, 1000, user), gpus, [3 << 30] * len(gpus), "placed")
    agent.jobdir(job.id).path.mkdir(parents=True, exist_ok=True)
    write_region(new_shared_region(agent.jobdir(job.id).path), counters)
    return job


def busy_agent(agent: Agent) -> None:
    """Running jobs with usage and counters, queued ones of both priorities, a flagged job,
    and both histograms observed."""
    store = agent.store
    for n, (name, user, gpus) in enumerate(
        [(ODD_NAME, ODD_USER, [0, 1]), ("", "alice", [1]), ("train", "bob", [0])]
    ):
        spec = JobSpec(argv=(sys.executable, "-c", "pass"), gpus=len(gpus), compute=333, name=name)
        counters = [(n, 1_500_000_000 * (n + 1), 7), (2, 3, 40_000_000_000)]
        job = start_shared_job(agent, spec, user, gpus, counters)
        for gpu in gpus:
            agent.observed.per_gpu[(job.id, gpu)] = Usage(123 << 20, None if n == 1 else 42)
    agent.watchdog.flagged.add(job.id)
    whole = JobSpec(argv=("sleep", "60"), mode=Mode.EXCLUSIVE)
    store.start(store.add(whole, 0, "root"), [1], [], "placed")
    store.add(JobSpec(argv=("sleep", "1"), priority=Priority.LOW), 0, "root")
    store.add(JobSpec(argv=("sleep", "1"), name="next"), 0, "root")
    for seconds in (0.0002, 0.003, 0.2, 7.0):
        agent.observed.scheduling.observe(seconds)
        agent.observed.started(0.0, now=seconds * 1000)
