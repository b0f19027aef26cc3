"""Submits stored a batch per transaction: each checked apart from the others, answered in
order, and none left waiting when storing fails."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest
from tests.agent.test_robust_store import hold_write_lock

from gpupool.agent.agent import Agent
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.api.submit_batch import SubmitBatcher
from gpupool.core.errors import GpupoolError, InvalidRequest, StoreBusy, Unschedulable
from gpupool.scheduler.recent import DECAY, RecentShapes


def share(name: str, gpus: int = 1) -> JobSpec:
    return JobSpec(("true",), name=name, gpus=gpus, compute=50, workdir="/")


def saved_window(agent: Agent) -> list[dict[str, object]]:
    """The target workload's window as saved in the store (none yet: the prior)."""
    return list(json.loads(agent.store.setting("target_workload") or RecentShapes().to_json()))


def total(window: list[dict[str, object]]) -> float:
    return sum(float(cast(float, row["weight"])) for row in window)


def test_a_batch_stores_the_shares_that_fit_and_refuses_the_others_alone(agent: Agent) -> None:
    before = saved_window(agent)
    outcome = agent.submit_many(
        [
            (share("a"), 1000, "alice"),
            (share("wide", gpus=3), 1000, "alice"),
            (share("b"), 0, "root"),
        ]
    )
    first, refused, last = outcome
    assert isinstance(first, Job) and isinstance(last, Job) and last.id == first.id + 1
    assert isinstance(refused, Unschedulable) and "3 GPUs" in str(refused)
    assert [(j.name, j.user, j.state) for j in agent.store.jobs()] == [
        ("a", "alice", State.QUEUED),
        ("b", "root", State.QUEUED),
    ]
    # the two stored shares count in the saved target workload, the refused one does not
    after = saved_window(agent)
    assert total(after) == pytest.approx(total(before) * DECAY**2 + DECAY + 1)
    assert not [row for row in after if row["gpus"] == 3]


def test_a_spec_changed_after_it_was_made_is_refused_at_submit(agent: Agent) -> None:
    spec = share("changed")
    spec.env["BAD NAME"] = "1"  # env is a dict: the constructor's check is not the last word
    with pytest.raises(InvalidRequest, match="BAD NAME"):
        agent.submit(spec, 0, "root")
    changed, kept = agent.submit_many([(spec, 0, "root"), (share("kept"), 0, "root")])
    assert isinstance(changed, InvalidRequest) and isinstance(kept, Job)
    assert [job.name for job in agent.store.jobs()] == ["kept"]


def test_a_store_that_fails_fails_every_share_of_the_batch_and_stores_none(
    agent: Agent, tmp_path: Path
) -> None:
    window = agent.store.setting("target_workload")
    holder = hold_write_lock(tmp_path / "state" / "state.db", 3)
    try:
        outcome = agent.submit_many(
            [
                (share("a"), 1000, "alice"),
                (share("wide", gpus=3), 1000, "alice"),
                (share("b"), 0, "root"),
            ]
        )
    finally:
        holder.join()
    assert [type(o) for o in outcome] == [StoreBusy, Unschedulable, StoreBusy]
    assert agent.store.jobs() == [] and agent.store.setting("target_workload") == window


class _Agent:
    """Stands in for the agent: a batch waits for `release`; a spec named "bad" is refused, one
    named "bug" makes the whole call raise."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.next_id = 1

    def submit_many(self, submits: Sequence[tuple[JobSpec, int, str]]) -> list[Job | GpupoolError]:
        self.release.wait(10)
        self.batches.append([spec.name for spec, _, _ in submits])
        if any(spec.name == "bug" for spec, _, _ in submits):
            raise RuntimeError("a bug")
        out: list[Job | GpupoolError] = []
        for spec, uid, user in submits:
            if spec.name == "bad":
                out.append(InvalidRequest("bad spec"))
            else:
                out.append(Job(self.next_id, spec, uid, user, State.QUEUED, 0.0))
                self.next_id += 1
        return out


def test_submits_waiting_together_are_one_batch_and_each_gets_its_own_answer() -> None:
    fake = _Agent()
    batcher = SubmitBatcher(cast(Agent, fake))

    async def flood() -> list[bytes | BaseException]:
        first = asyncio.ensure_future(batcher.submit(share("first"), 0))
        await asyncio.sleep(0.2)  # the thread holds the first, alone, in submit_many
        names = ["a", "bad", "b", "c"]
        rest = [asyncio.ensure_future(batcher.submit(share(n), 1000)) for n in names]
        await asyncio.sleep(0.1)
        fake.release.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    answers = asyncio.run(flood())
    assert fake.batches == [["first"], ["a", "bad", "b", "c"]]
    first, a, bad, b, c = answers
    assert isinstance(bad, InvalidRequest)
    ids = [json.loads(cast(bytes, x))["job"]["id"] for x in (first, a, b, c)]
    assert ids == [1, 2, 3, 4]
    assert json.loads(cast(bytes, b))["job"]["name"] == "b"


def test_a_batch_that_raises_answers_every_submit_of_it_with_the_error() -> None:
    fake = _Agent()
    fake.release.set()
    batcher = SubmitBatcher(cast(Agent, fake))

    async def submits() -> list[bytes | BaseException]:
        return await asyncio.gather(batcher.submit(share("bug"), 0), return_exceptions=True)

    (answer,) = asyncio.run(asyncio.wait_for(submits(), 10))
    assert isinstance(answer, RuntimeError)


def test_an_answer_for_a_closed_loop_leaves_the_thread_serving_the_others() -> None:
    fake = _Agent()
    fake.release.set()
    batcher = SubmitBatcher(cast(Agent, fake))
    gone = asyncio.new_event_loop()
    gone.run_until_complete(batcher.submit(share("first"), 0))  # the thread runs now
    gone.close()
    fake.release.clear()  # hold the next batch until the closed loop's submit is queued in it

    async def orphan() -> None:  # queued for a loop that will have closed by its answer
        await batcher.submit(share("orphan"), 0)

    stranded = asyncio.new_event_loop()
    task = stranded.create_task(orphan())
    stranded.run_until_complete(asyncio.sleep(0.1))
    stranded.close()
    del task
    fake.release.set()
    answer = asyncio.run(asyncio.wait_for(batcher.submit(share("after"), 0), 10))
    assert json.loads(answer)["job"]["name"] == "after"
