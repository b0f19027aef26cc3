"""What the daemon holds for a job comes back however the job ends: its share at the compute
arbiter after a launch that failed once it was registered, and what the daemon keeps of a job in
memory (cancel deadline, peak memory, MPS failure, listing entry) after a job that failed in its
bookkeeping, or that ended while a sample or a listing was read."""

from __future__ import annotations

from typing import Any

import pytest
from tests.agent.daemon_support import until

from gpupool.agent.agent import Agent
from gpupool.agent.jobdir import JobDir
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.isolation.arbiter import read_shares, view_file


def _submit(agent: Agent, argv: tuple[str, ...], name: str) -> int:
    # a tenth of a GPU: arbitrated, so registered with the node's arbiter at launch
    return agent.submit(JobSpec(argv, name=name, compute=100, workdir="/"), 0, "root").id


def _shares(agent: Agent) -> list[int]:
    directory = agent.arbiter.directory
    return [
        share.share_id
        for uuid in agent.launch_node.uuids
        if uuid is not None
        for share in read_shares(view_file(directory, uuid))
    ]


def test_a_launch_that_fails_after_its_registration_gives_the_share_back(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = JobDir.write_launch

    def write_launch(jobdir: JobDir, launch: dict[str, Any]) -> None:
        if "bad" in launch["argv"]:
            raise OSError("injected: no space left on device")
        real(jobdir, launch)

    monkeypatch.setattr(JobDir, "write_launch", write_launch)
    bad = _submit(agent, ("echo", "bad"), "bad")
    agent.start()
    assert until(lambda: agent.store.job(bad).state.finished)
    detail = agent.store.events(bad)[-1]["detail"]
    assert agent.store.job(bad).state is State.FAILED and "injected" in detail, detail
    assert _shares(agent) == []
    good = _submit(agent, ("sleep", "30"), "good")  # the arbiter still takes the next one
    assert until(lambda: len(_shares(agent)) == 1), agent.store.events(good)


def test_a_cancelled_job_failing_in_its_bookkeeping_leaves_nothing_in_memory(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = agent._finish

    def finish(job: Job, *args: Any) -> None:
        if job.spec.name == "bad":
            raise OSError("injected: cannot read its exit file")
        real(job, *args)

    monkeypatch.setattr(agent, "_finish", finish)
    job_id = _submit(agent, ("sleep", "30"), "bad")
    agent.start()
    assert until(lambda: agent.jobdir(job_id).pids() is not None)
    agent.sampler._peaks[job_id] = 1 << 20  # seen holding memory
    agent.mps_jobs._failed[job_id] = "its MPS server died"
    agent.cancel(job_id, 0, "root")
    assert job_id in agent._cancel_at
    assert until(lambda: agent.store.job(job_id).state.finished)
    assert until(lambda: job_id not in agent._cancel_at)
    assert job_id not in agent.sampler._peaks
    assert job_id not in agent.mps_jobs._failed
    assert _shares(agent) == []


def test_a_peak_or_listing_kept_for_a_job_that_ended_meanwhile_goes(agent: Agent) -> None:
    job_id = _submit(agent, ("true",), "short")
    agent.start()
    assert until(lambda: agent.store.job(job_id).state.finished)
    assert agent.prune(0) == 1
    # what a sample or a listing that read the job before its end or its prune keeps after it
    agent.sampler._peaks[job_id] = 1 << 20
    agent.view._listed[job_id] = (0, b"{}", b"{}")
    agent.sampler.sample()
    agent.prune(0)
    assert job_id not in agent.sampler._peaks
    assert job_id not in agent.view._listed
