"""The compute arbiter: shares busy at the same time on one simulated GPU.

Every share runs its own client (its own region, as separate `gpupool exec` launches would),
registered with the node's trusted arbiter (a real gpupool-arbiterd) as the daemon does. Each
launches 1 ms kernels back to back for a fixed wall time; a share's result is its throughput over
the same loop's exclusive throughput. The simulated GPU runs one kernel at a time, in order,
across processes, so without the arbiter each share is charged for the others' kernels too and
every share falls short (30/70 gave 21/54).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from shim_support import (
    PROGS,
    Result,
    arbiter,
    compile_prog,
    gpu_uuid,
    make_node,
    register,
    run_client,
    shim_env,
    start_client,
)

from gpupool.isolation.arbiter_control import ArbiterControl

pytestmark = pytest.mark.serial  # wall-clock shares and latencies: run alone (Makefile)

SECONDS = 2.0
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


@pytest.fixture
def arb(tmp_path: Path) -> Iterator[ArbiterControl]:
    with arbiter(tmp_path / "arbiter") as (control, _pid):
        yield control


def share_env(
    arb: ArbiterControl,
    node: Path,
    percent: int = 100,
    policy: str = "cap",
    priority: str | None = None,
    **more: str,
) -> dict[str, str]:
    """A registered share's environment on GPU 0 of `node`."""
    settings = register(arb, gpu_uuid(node), percent, policy, priority)
    if percent < 100:
        settings["COMPUTE_LIMIT"] = str(percent)
        settings["COMPUTE_POLICY"] = policy
    if priority is not None:
        settings["COMPUTE_PRIORITY"] = priority
    return shim_env(node, **settings, **more)


def throughput(result: Result) -> float:
    assert result.returncode == 0, result.stderr
    ((launches, elapsed_ns),) = result.step("run")
    return int(launches) * 1e9 / int(elapsed_ns)


def together(
    client: Path,
    node: Path,
    tmp_path: Path,
    shares: Sequence[tuple[int, str]],
    arb: ArbiterControl,
) -> list[float]:
    """Each share's throughput over exclusive throughput, all busy at once."""
    base = throughput(run_client(client, shim_env(node), "run", SECONDS, "kernel"))
    results: list[Result | None] = [None] * len(shares)

    def one(i: int, percent: int, policy: str) -> None:
        env = share_env(arb, node, percent, policy, SHARED_REGION=str(tmp_path / f"region-{i}"))
        results[i] = run_client(client, env, "run", SECONDS, "kernel")

    threads = [
        threading.Thread(target=one, args=(i, p, policy)) for i, (p, policy) in enumerate(shares)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [throughput(r) / base for r in results if r is not None]


@pytest.mark.parametrize("shares", [(30, 70), (10, 90)])
def test_two_capped_shares_busy_together_each_get_their_share(
    client: Path, tmp_path: Path, shares: tuple[int, int], arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    got = together(client, node, tmp_path, [(p, "cap") for p in shares], arb)
    for ratio, percent in zip(got, shares, strict=True):
        assert abs(ratio - percent / 100) <= TOLERANCE, f"{shares}: {got}"
    assert sum(got) >= 0.90, f"the GPU idle while both wanted more: {got}"


def test_four_shares_of_a_quarter_each_get_a_quarter(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    got = together(client, node, tmp_path, [(25, "cap")] * 4, arb)
    assert all(abs(ratio - 0.25) <= TOLERANCE for ratio in got), got


def test_share_policy_holds_its_share_next_to_a_busy_share(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    mine, other = together(client, node, tmp_path, [(30, "share"), (70, "cap")], arb)
    assert abs(mine - 0.30) <= TOLERANCE, (mine, other)
    assert abs(other - 0.70) <= TOLERANCE, (mine, other)


def test_share_policy_uses_what_a_capped_neighbour_leaves(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    mine, other = together(client, node, tmp_path, [(30, "share"), (10, "cap")], arb)
    assert mine >= 0.85 - TOLERANCE, (mine, other)
    assert abs(other - 0.10) <= TOLERANCE, (mine, other)


def test_a_share_killed_while_busy_leaves_the_gpu_to_the_others(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    base = throughput(run_client(client, shim_env(node), "run", SECONDS, "kernel"))
    doomed_env = share_env(arb, node, 90, SHARED_REGION=str(tmp_path / "doomed"))
    doomed = start_client(client, doomed_env, "run", 30, "kernel")
    try:
        time.sleep(0.5)  # busy, and holding the lease most of the time
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        env = share_env(arb, node, 50, SHARED_REGION=str(tmp_path / "survivor"))
        ratio = throughput(run_client(client, env, "run", SECONDS, "kernel")) / base
    finally:
        doomed.kill()
        doomed.communicate()
    assert abs(ratio - 0.50) <= TOLERANCE, ratio


def prioritized(
    client: Path,
    node: Path,
    tmp_path: Path,
    priority: str,
    arb: ArbiterControl,
    seconds: float = SECONDS,
) -> Result:
    env = share_env(arb, node, priority=priority, SHARED_REGION=str(tmp_path / priority))
    return run_client(client, env, "run", seconds, "kernel")


def test_a_low_share_gives_the_gpu_to_a_busy_high_share(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    base = throughput(run_client(client, shim_env(node), "run", SECONDS, "kernel"))
    results: dict[str, Result] = {}
    low = threading.Thread(
        target=lambda: results.update(
            low=prioritized(client, node, tmp_path, "low", arb, SECONDS + 1)
        )
    )
    low.start()
    time.sleep(0.5)  # the low share has the GPU to itself, then the high one comes
    high = throughput(prioritized(client, node, tmp_path, "high", arb)) / base
    low.join()
    assert high >= 0.95 - TOLERANCE, high
    # low ran alone for about 0.5 s and 0.5 s after high was done, of 3 s: about a third
    assert throughput(results["low"]) / base <= 1 / 3 + 2 * TOLERANCE


def test_a_low_share_alone_uses_the_whole_gpu(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    base = throughput(run_client(client, shim_env(node), "run", SECONDS, "kernel"))
    low = throughput(prioritized(client, node, tmp_path, "low", arb)) / base
    assert low >= 0.95 - TOLERANCE


# A latency-bound high share next to a busy low one: the high service runs one request at a time
# (REQUEST_KERNELS kernels of 0.25 ms, then a synchronize) with host gaps between requests; the
# low share launches 0.2 ms kernels back to back. Kernels are not preemptible, so a high request
# may wait for what the low share has in flight when it arrives: at most one of its small slices.
HIGH_KERNEL_NS = 1_000_000  # a 256-block kernel; the service's 64-block kernels take 0.25 ms
LOW_KERNEL_NS = 200_000
REQUEST_KERNELS = 20
REQUEST_GAP_US = 5000
LOW_SLICE_NS = 600_000  # the low share's slice (0.5 ms of work) and the lease hand-over
P99_JITTER_NS = 3_000_000
ATTEMPTS = 3


@dataclass
class Requests:
    count: int
    p50_ns: int
    p99_ns: int
    elapsed_ns: int

    @property
    def busy(self) -> float:
        """The fraction of the wall time the service's kernels took."""
        kernel_ns = HIGH_KERNEL_NS * 64 / 256
        return self.count * REQUEST_KERNELS * kernel_ns / self.elapsed_ns


def serve(request_loop: Path, env: dict[str, str], seconds: float) -> Requests:
    result = run_client(
        request_loop, env, seconds, REQUEST_KERNELS, 64, REQUEST_GAP_US, timeout=seconds + 30
    )
    assert result.returncode == 0, result.stderr
    ((count, p50, p99, _max, elapsed),) = result.step("requests")
    return Requests(int(count), int(p50), int(p99), int(elapsed))


def beside_low(
    client: Path, request_loop: Path, high_env: dict[str, str], low_env: dict[str, str]
) -> tuple[Requests, float]:
    """The service next to a busy low share, and the fraction of the GPU the low share used."""
    results: dict[str, Result] = {}
    low = threading.Thread(
        target=lambda: results.update(low=run_client(client, low_env, "run", SECONDS, "kernel"))
    )
    low.start()
    high = serve(request_loop, high_env, SECONDS)
    low.join()
    ((launches, low_elapsed),) = results["low"].step("run")
    return high, int(launches) * LOW_KERNEL_NS / int(low_elapsed)


def test_a_high_request_loop_keeps_its_latency_and_the_low_share_uses_its_gaps(
    client: Path, request_loop: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    high_env = share_env(
        arb,
        node,
        priority="high",
        SHARED_REGION=str(tmp_path / "high"),
        SIM_KERNEL_NS=str(HIGH_KERNEL_NS),
    )
    low_env = share_env(
        arb,
        node,
        priority="low",
        SHARED_REGION=str(tmp_path / "low"),
        SIM_KERNEL_NS=str(LOW_KERNEL_NS),
    )
    # the latency jitters by milliseconds on 2 busy CPU cores, even alone (a hand-over needs the
    # arbiter's process scheduled too): a pair that misses is measured again (at most ATTEMPTS
    # pairs); the low share's use always holds
    for attempt in range(ATTEMPTS):
        alone = serve(request_loop, high_env, SECONDS)
        high, low_busy = beside_low(client, request_loop, high_env, low_env)
        idle = 1 - high.busy
        assert low_busy >= 0.5 * idle, (low_busy, idle, high)
        # the median request waits at most one low slice more than alone (it waited for the
        # low share's lease before: +0.8 ms)
        median_holds = high.p50_ns <= alone.p50_ns + LOW_SLICE_NS
        tail_holds = high.p99_ns <= alone.p99_ns * 1.10 + P99_JITTER_NS
        if (median_holds and tail_holds) or attempt == ATTEMPTS - 1:
            break
    assert median_holds, (high, alone)
    assert tail_holds, (high, alone)


def test_a_low_share_uses_what_a_capped_share_without_priority_leaves(
    client: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    """A share asleep for its cap does not want the GPU: a low share next to it gets the rest."""
    node = make_node(tmp_path / "node")
    base = throughput(run_client(client, shim_env(node), "run", SECONDS, "kernel"))
    results: dict[str, Result] = {}

    def one(name: str, env: dict[str, str]) -> None:
        results[name] = run_client(client, env, "run", SECONDS, "kernel")

    capped_env = share_env(arb, node, 30, SHARED_REGION=str(tmp_path / "capped"))
    low_env = share_env(arb, node, 60, priority="low", SHARED_REGION=str(tmp_path / "low"))
    threads = [
        threading.Thread(target=one, args=("capped", capped_env)),
        threading.Thread(target=one, args=("low", low_env)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    capped, low = (throughput(results[name]) / base for name in ("capped", "low"))
    assert abs(capped - 0.30) <= TOLERANCE, (capped, low)
    assert abs(low - 0.60) <= TOLERANCE, (capped, low)
