"""Soak: one daemon through many jobs, service scale and park cycles and client connections;
nothing it holds may grow with the work done.

One `gpupool serve --router --watchdog kill` on a simulated 2x A100-40GB node. Jobs of `true`
(5 % of a GPU, 1 GiB: each registered with the node's compute arbiter) are submitted in waves,
each by one process of a real Unix user over many connections at once (as root: a few users of
the socket group, the oldest replaced by a new user now and then; otherwise this user). Beside
them --pairs threads each cycle two services at once: one scaled from 1 replica to 2 and back, one
of MIN 0 woken by a request through the router and parked again (suspended to host memory); once
the jobs are done the cycles go on to --cycles. Every --sample-every jobs (every --sample-s
seconds after the jobs), with the cycles held and the finished jobs pruned, the daemon's RSS,
open files, threads, the arbiter slots in use on each GPU, the store's size (state.db and its
-wal), the job directories and the p99 of 1,000 calls of GET /v1/jobs over the Unix socket are
sampled.

At the end every figure must be within 10 % of its value after --baseline jobs (a count below 20
within 2; the p99 as the median of three samples at each end), no GPU may ever run out of
arbiter slots (64), and jobs capped at 30 % and 70 %, both busy on one GPU, must get their caps
within 5 points, at the baseline and at the end. Exit 1 if not, saying which.

    python bench/soak.py [--jobs 20000] [--cycles 2000] [--pairs 8] [--minutes M] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple, fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_support import machine_load  # noqa: E402
from inference_support import free_port  # noqa: E402
from soak_support import (  # noqa: E402
    Figures,
    People,
    Services,
    build_client,
    caps,
    gpu_uuids,
    sample,
    wait_ended,
)
from tests.agent.conftest import _kill_jobs  # noqa: E402
from tests.agent.daemon_support import Daemon  # noqa: E402
from tests.users import create_group, remove_group, world_dir  # noqa: E402

from gpupool.isolation.arbiter import SHARES  # noqa: E402

SPEC = "2xA100-40GB"
GROWTH = 0.10
COUNT_SLACK, SMALL_COUNT = 2, 20
POINTS = 0.05
CAPS = (0.30, 0.70)
P99_SAMPLES = 3


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20000, help="jobs in all")
    parser.add_argument("--cycles", type=int, default=2000, help="service cycles in all")
    parser.add_argument("--pairs", type=int, default=8, help="service pairs cycled at once")
    parser.add_argument(
        "--sample-s", type=float, default=60, help="seconds between samples once the jobs are done"
    )
    parser.add_argument("--wave", type=int, default=200, help="jobs a submitter sends at once")
    parser.add_argument("--threads", type=int, default=16, help="a submitter's connections")
    parser.add_argument("--sample-every", type=int, default=1000, help="jobs between samples")
    parser.add_argument("--baseline", type=int, default=1000, help="jobs before the baseline")
    parser.add_argument("--users", type=int, default=3, help="users at a time (as root)")
    parser.add_argument("--user-every", type=int, default=5, help="waves between user changes")
    parser.add_argument("--minutes", type=float, default=0, help="stop the jobs and cycles after M")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    return parser.parse_args()


def _row(figures: Figures) -> str:
    values = []
    for value in astuple(figures):
        if isinstance(value, tuple):
            values.append("/".join(str(v) for v in value))
        elif isinstance(value, float):
            values.append(f"{value:.1f}")
        else:
            values.append(str(value))
    return "| " + " | ".join(values) + " |"


def table(samples: list[Figures]) -> str:
    names = [f.name for f in fields(Figures)]
    head = "| " + " | ".join(names) + " |\n|" + "---|" * len(names)
    return "\n".join([head, *(_row(s) for s in samples)])


def grown(after_base: list[Figures]) -> list[str]:
    """The figures that grew past the limits from the baseline (the first of `after_base`) to
    the end (its last). The API's p99 is the median of three samples at each end: one sample's
    moves by more than 10 % with the machine's other work."""
    base, end = after_base[0], after_base[-1]
    found = []
    for name in ("rss_mib", "fds", "threads", "store_kib", "job_dirs", "p99_ms"):
        first, last = getattr(base, name), getattr(end, name)
        if name == "p99_ms":
            first = statistics.median(s.p99_ms for s in after_base[:P99_SAMPLES])
            last = statistics.median(s.p99_ms for s in after_base[-P99_SAMPLES:])
        allowed = first * (1 + GROWTH)
        if isinstance(first, int) and first < SMALL_COUNT:
            allowed = first + COUNT_SLACK
        if last > allowed:
            found.append(f"{name}: {first:g} after {base.jobs} jobs, {last:g} at the end")
    if sum(end.slots) > sum(base.slots):
        found.append(f"arbiter slots: {base.slots} after {base.jobs} jobs, {end.slots} at the end")
    return found


def off_caps(when: str, got: tuple[float, float]) -> list[str]:
    return [
        f"{when}: a {cap:.0%} cap got {share:.1%} of the GPU"
        for cap, share in zip(CAPS, got, strict=True)
        if abs(share - cap) > POINTS
    ]


class Soak:
    """The run: jobs in waves, the services cycled beside them, samples and caps measured."""

    def __init__(self, args: argparse.Namespace, daemon: Daemon, people: People, router: str):
        self.args, self.daemon, self.people = args, daemon, people
        self.uuids = gpu_uuids(daemon)
        self.client = build_client(daemon.root)
        self.services = Services(daemon, router, args.cycles, args.pairs)
        self.samples: list[Figures] = []
        self.caps: list[tuple[str, tuple[float, float]]] = []
        self.problems: list[str] = []
        self.done = 0
        self.began = time.monotonic()

    def run(self) -> list[str]:
        """Drive the daemon; what went wrong, in words."""
        args = self.args
        self.services.start()
        print(table([]), flush=True)
        deadline = time.monotonic() + args.minutes * 60 if args.minutes else float("inf")
        wave = 0
        while self.done < args.jobs and time.monotonic() < deadline:
            count = min(args.wave, args.jobs - self.done)
            wait_ended(self.daemon, self.people.submit(self.daemon, wave, count, args.threads))
            self.done, wave = self.done + count, wave + 1
            if wave % args.user_every == 0:
                self.people.turn()
            if self.done % args.sample_every == 0:
                self._sample()
            if self.done == args.baseline:
                self._caps("at the baseline")
        while not self.services.finished and time.monotonic() < deadline:
            time.sleep(min(args.sample_s, max(0.0, deadline - time.monotonic())))
            self._sample()
        if not self.samples or self.samples[-1].jobs != self.done:
            self._sample()
        self._caps("at the end")
        self.services.stop()
        return self._verdict()

    def _sample(self) -> None:
        with self._held():
            figures = sample(self.daemon, self.uuids, self.done, self.services.cycles, self.began)
        print(_row(figures), flush=True)
        self.samples.append(figures)
        if max(figures.slots) >= SHARES:
            self.problems.append(f"after {self.done} jobs: a GPU's arbiter slots are all taken")

    def _caps(self, when: str) -> None:
        with self._held():
            self.caps.append((when, caps(self.daemon, self.client)))

    @contextmanager
    def _held(self) -> Iterator[None]:
        self.services.pause()
        try:
            yield
        finally:
            self.services.resume()

    def _verdict(self) -> list[str]:
        after_base = [s for s in self.samples if s.jobs >= self.args.baseline] or self.samples
        problems = self.problems + grown(after_base)
        for when, got in self.caps:
            print(f"caps {when}: the 30 % job got {got[0]:.1%}, the 70 % one {got[1]:.1%}")
            problems += off_caps(when, got)
        summary = (
            f"{self.done} jobs, {self.services.cycles} service cycles, "
            f"{self.people.made or 'no'} users made"
        )
        print(summary)
        if self.args.out is not None:
            self.args.out.write_text(f"{summary}\n\n{table(self.samples)}\n")
        return problems


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # through main's cleanup: users, group, daemon, jobs


def main() -> None:
    args = _arguments()
    signal.signal(signal.SIGTERM, _stop)
    root = world_dir() if _root() else Path(tempfile.mkdtemp(prefix="gpupool-soak-"))
    group = create_group("gpsg") if _root() else None
    people = People(group, args.users)
    port = free_port()
    extra = ("--router", f"127.0.0.1:{port}", "--watchdog", "kill")
    extra += ("--socket-group", group) if group is not None else ()
    print(f"soak on a simulated {SPEC}; {machine_load()}", flush=True)
    began = time.monotonic()
    daemon = Daemon(root, SPEC, extra).start()
    try:
        problems = Soak(args, daemon, people, f"http://127.0.0.1:{port}").run()
    finally:
        daemon.stop()
        _kill_jobs(daemon)
        people.close()
        if group is not None:
            remove_group(group)
        shutil.rmtree(root, ignore_errors=True)
    print(f"{time.monotonic() - began:.0f} s; {machine_load()}")
    for problem in problems:
        print(f"FAIL {problem}")
    sys.exit(1 if problems else 0)


def _root() -> bool:
    return os.geteuid() == 0


if __name__ == "__main__":
    main()
