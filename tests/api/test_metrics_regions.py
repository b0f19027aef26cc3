"""/metrics keeps each running share's region open between scrapes: the values are always the
region's own, and a job's descriptor is closed once it ended (none leaks)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.api.metrics_support import start_shared_job, write_region

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.api.exposition import Family
from gpupool.api.metrics import AgentCollector
from gpupool.core.errors import ConfigError
from gpupool.devices.factory import open_backend
from gpupool.isolation.launch import find_shared_region
from gpupool.isolation.region import OpenRegions

SPEC = JobSpec(argv=(sys.executable, "-c", "pass"), compute=250)


def held_under(under: Path) -> list[str]:
    """The files under `under` this process holds open (other tests' garbage is not counted)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target.startswith(str(under)):
            found.append(target)
    return sorted(found)


def open_regions(under: Path) -> list[str]:
    """The region files this process holds open under `under`."""
    return [path for path in held_under(under) if path.split(" ")[0].endswith("/region")]


def refused(collector: AgentCollector) -> dict[str, float]:
    (family,) = [
        f
        for f in collector.families()
        if isinstance(f, Family) and f.name == "gpupool_job_refused_allocations"
    ]
    return {values[0]: value for values, value in family.samples}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        agent.observed.sampled(backend.snapshot(), {})
        yield agent
        agent.store.close()


def end(agent: Agent, job: Job) -> None:
    """What the daemon does when a job ends: record it, then remove its region."""
    agent.store.finish(job.id, State.SUCCEEDED, 0, finished_at=1.0)
    region = find_shared_region(agent.jobdir(job.id).path)
    assert region is not None
    shutil.rmtree(region.parent)


def test_regions_stay_open_while_their_jobs_run_and_no_value_is_stale(
    agent: Agent, tmp_path: Path
) -> None:
    before = held_under(tmp_path)
    first = start_shared_job(agent, SPEC, "alice", [0], [(1, 0, 0)])
    second = start_shared_job(agent, SPEC, "bob", [1], [(2, 0, 0)])
    collector = AgentCollector(agent.view)
    assert refused(collector) == {str(first.id): 1, str(second.id): 2}
    assert len(open_regions(tmp_path)) == 2
    assert refused(collector) == {str(first.id): 1, str(second.id): 2}
    assert len(open_regions(tmp_path)) == 2  # kept, not opened again

    # the library counts on in the same file: the next scrape reads the new values
    region = find_shared_region(agent.jobdir(second.id).path)
    assert region is not None
    write_region(region, [(5, 0, 0)])
    assert refused(collector) == {str(first.id): 1, str(second.id): 5}

    # a job ends: its region is closed at the next scrape; a new job's values are its own
    end(agent, first)
    third = start_shared_job(agent, SPEC, "carol", [0], [(9, 0, 0)])
    assert refused(collector) == {str(second.id): 5, str(third.id): 9}
    held = open_regions(tmp_path)
    assert len(held) == 2 and not any(f"/jobs/{first.id}/" in path for path in held)

    end(agent, second)
    end(agent, third)
    assert refused(collector) == {}
    assert open_regions(tmp_path) == []
    assert held_under(tmp_path) == before


def test_a_truncated_region_reads_short_and_a_missing_one_holds_nothing(tmp_path: Path) -> None:
    regions = OpenRegions()
    path = tmp_path / "region"
    write_region(path, [(3, 0, 0)])
    counters = regions.read(path, 1)
    assert counters is not None and counters[0].refused_allocations == 3
    # a job may truncate its own region: a mapping read past the end would kill the daemon
    os.truncate(path, 0)
    assert regions.read(path, 1) is None  # as a region its first process has not written yet
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match="not a gpupool shared region of this version"):
        regions.read(path, 1)
    assert regions.read(tmp_path / "none", 1) is None
    assert open_regions(tmp_path) == [str(path)]
    regions.keep(())
    assert open_regions(tmp_path) == []
