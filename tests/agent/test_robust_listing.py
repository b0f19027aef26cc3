"""The listing of every job (`ps --all`): the agent keeps each finished job's encoded entry, so
the listing must still show each job as it is now, and forget the pruned ones."""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import JobSpec, State
from gpupool.devices.factory import open_backend


def test_the_listing_follows_each_job_and_forgets_the_pruned(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        store = agent.store
        ids = [store.add(JobSpec(("true",), name=f"j{n}"), 0, "root").id for n in range(3)]
        store.finish(ids[0], State.SUCCEEDED, 0, finished_at=time.time())

        def listed(everything: bool, mine: bool = True) -> list[dict[str, object]]:
            body = agent.view.jobs_json(everything, lambda owner: mine)
            jobs = json.loads(body)["jobs"]
            assert isinstance(jobs, list)
            return jobs

        def expected(everything: bool) -> list[dict[str, object]]:
            return [agent.view.job_json(job) for job in agent.view.jobs(everything)]

        for _ in range(2):  # the second time from the kept entries
            assert listed(True) == expected(True)
            assert [job["state"] for job in listed(True)] == ["succeeded", "queued", "queued"]
            # another user's view of the same entries: everything but the command
            hidden = [{**job, "command": None} for job in expected(True)]
            assert listed(True, mine=False) == hidden
        assert [job["id"] for job in listed(False)] == ids[1:]
        store.finish(ids[1], State.FAILED, 1, finished_at=time.time())
        assert [job["state"] for job in listed(True)] == ["succeeded", "failed", "queued"]
        assert listed(False) == expected(False)
        assert agent.prune(0) == 2
        assert listed(True) == expected(True) == [agent.view.job_json(store.job(ids[2]))]
        store.close()
