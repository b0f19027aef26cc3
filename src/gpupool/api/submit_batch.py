"""Submits stored off the event loop, a batch at a time.

The store's lock and SQLite's writes must never hold the event loop, which serves every other
client, so a submit is handed to a thread of its own. Under a flood of submits (many clients at
once) that thread takes every submit waiting when it comes round and stores them through
`Agent.submit_many`, one transaction for the batch, then hands all their answers back to the
loop in one call: a hop and a commit per batch instead of per submit
(docs/benchmarks/daemon.md). A lone submit is a batch of one and waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from dataclasses import dataclass

from gpupool.agent.access import user_name
from gpupool.agent.agent import Agent
from gpupool.agent.jobs import JobSpec

#: the most submits stored in one transaction: above the clients a busy node sees at once, and
#: at most about 16 MiB of specs (jobs.py bounds each command and environment to 128 KiB)
MAX_BATCH = 64


@dataclass(frozen=True)
class _Waiting:
    spec: JobSpec
    uid: int
    loop: asyncio.AbstractEventLoop
    answer: asyncio.Future[bytes]


class SubmitBatcher:
    """Stores submits for `agent` on the thread `gpupool-submit` (started at the first)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._waiting: queue.SimpleQueue[_Waiting] = queue.SimpleQueue()
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None

    async def submit(self, spec: JobSpec, uid: int) -> bytes:
        """`{"job": ...}` for the job stored, encoded; the agent's error when it was refused."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bytes] = loop.create_future()
        self._waiting.put(_Waiting(spec, uid, loop, answer))
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gpupool-submit", daemon=True
                )
                self._thread.start()
        return await answer

    def _run(self) -> None:
        while True:
            batch = [self._waiting.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._waiting.get_nowait())
                except queue.Empty:
                    break
            answers: list[tuple[_Waiting, bytes | BaseException]] = []
            try:
                stored = self._agent.submit_many([(w.spec, w.uid, user_name(w.uid)) for w in batch])
                for waiting, job in zip(batch, stored, strict=True):
                    if isinstance(job, Exception):
                        answers.append((waiting, job))
                    else:
                        answers.append((waiting, json.dumps({"job": job.to_json()}).encode()))
            except Exception as err:  # a bug: every submit of the batch answers 500, none hangs
                answers = [(waiting, err) for waiting in batch]
            for loop in {waiting.loop for waiting in batch}:
                mine = [(w, a) for w, a in answers if w.loop is loop]
                with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits
                    loop.call_soon_threadsafe(_hand_back, mine)


def _hand_back(answers: list[tuple[_Waiting, bytes | BaseException]]) -> None:
    """On the loop: each answer to its submit (one whose client went away is dropped)."""
    for waiting, answer in answers:
        if waiting.answer.done():
            continue
        if isinstance(answer, BaseException):
            waiting.answer.set_exception(answer)
        else:
            waiting.answer.set_result(answer)
