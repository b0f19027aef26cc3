"""The compute arbiter's time slices: two latency-bound `high` shares busy on one simulated GPU.

Each share is a real process through the interception library and a real gpupool-arbiterd. One
service issues requests back to back (a busy holder that never goes quiet), the other a request
every few milliseconds; each request is 4 kernels of 1 ms. The second service's request waits
for the first's lease: with the batch window (20 ms) for most of it, with a short slice for at
most the slice and what the holder has in flight (two 1 ms kernels).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from shim_support import (
    Result,
    arbiter,
    gpu_uuid,
    make_node,
    run_client,
    shim_env,
)

from gpupool.core.errors import ConfigError, DeviceError
from gpupool.isolation.arbiter import uuid_bytes
from gpupool.isolation.arbiter_control import REGISTER, ArbiterControl, ArbiterShare
from gpupool.isolation.arbiter_control import Registration as Reg

SECONDS = 2.0
KERNEL_NS = 1_000_000  # a 256-block kernel
KERNELS = 4  # a request
GAP_US = 5000  # the polite service's host time between requests
SLICE_US = 2000  # the latency slice under test
BATCH_WINDOW_NS = 20_000_000  # the arbiter's lease without a slice
IN_FLIGHT_NS = 2 * KERNEL_NS  # a holder has at most two batches in flight when asked back
JITTER_NS = 3_000_000  # two busy shared cores: a hand-over needs the arbiter scheduled too
ATTEMPTS = 3


@pytest.fixture
def arb(tmp_path: Path) -> Iterator[ArbiterControl]:
    with arbiter(tmp_path / "arbiter") as (control, _pid):
        yield control


def high_share(arb: ArbiterControl, node: Path, region: Path, slice_us: int) -> dict[str, str]:
    """A `high` share of the whole GPU with the given slice (0: the batch window)."""
    share = ArbiterShare.new()
    arb.register(Reg(share, os.getuid(), (gpu_uuid(node),), 100, "high", "cap", slice_us))
    return shim_env(
        node,
        ARBITER_DIR=str(arb.directory),
        ARBITER_SHARE=share.setting,
        COMPUTE_PRIORITY="high",
        SHARED_REGION=str(region),
        SIM_KERNEL_NS=str(KERNEL_NS),
    )


def p50_ns(result: Result) -> int:
    assert result.returncode == 0, result.stderr
    ((_count, p50, _p99, _max, _elapsed),) = result.step("requests")
    return int(p50)


def serve(request_loop: Path, env: dict[str, str], gap_us: int) -> Result:
    return run_client(request_loop, env, SECONDS, KERNELS, 256, gap_us, timeout=SECONDS + 30)


def polite_beside_busy(
    request_loop: Path, arb: ArbiterControl, node: Path, tmp_path: Path, slice_us: int
) -> int:
    """The polite service's median request beside a busy one, both with `slice_us`."""
    tag = f"slice-{slice_us}"
    busy_env = high_share(arb, node, tmp_path / f"busy-{tag}", slice_us)
    polite_env = high_share(arb, node, tmp_path / f"polite-{tag}", slice_us)
    results: dict[str, Result] = {}
    busy = threading.Thread(
        target=lambda: results.update(busy=serve(request_loop, busy_env, 0)), daemon=True
    )
    busy.start()
    polite = p50_ns(serve(request_loop, polite_env, GAP_US))
    busy.join()
    p50_ns(results["busy"])  # it ran, and its requests were served too
    return polite


@pytest.mark.serial
def test_a_latency_slice_bounds_the_wait_behind_another_busy_high_share(
    request_loop: Path, tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    # timings jitter by milliseconds on 2 busy shared cores: a set that misses is measured
    # again (at most ATTEMPTS); the batch window's long wait is asserted every time
    for attempt in range(ATTEMPTS):
        alone = p50_ns(serve(request_loop, high_share(arb, node, tmp_path / "alone", 0), GAP_US))
        short = polite_beside_busy(request_loop, arb, node, tmp_path, SLICE_US)
        batch = polite_beside_busy(request_loop, arb, node, tmp_path, 0)
        # behind the batch window the request waits for most of it: the busy share's lease was
        # GAP_US old when it came
        assert batch - alone >= BATCH_WINDOW_NS - GAP_US * 1000 - JITTER_NS, (alone, batch)
        bounded = short - alone <= SLICE_US * 1000 + IN_FLIGHT_NS + JITTER_NS
        if bounded or attempt == ATTEMPTS - 1:
            break
    assert bounded, (alone, short, batch)
    assert short < batch / 2, (alone, short, batch)


def test_the_arbiter_refuses_a_slice_out_of_bounds_and_unknown_terms(
    tmp_path: Path, arb: ArbiterControl
) -> None:
    node = make_node(tmp_path / "node")
    uuid = gpu_uuid(node)
    for slice_us in (50, 2_000_000):
        with pytest.raises(ConfigError, match="time slice"):
            arb.register(Reg(ArbiterShare.new(), os.getuid(), (uuid,), 50, "high", "cap", slice_us))
    # the control socket itself refuses them (a registration it does not understand is never
    # half taken), and bits it does not know
    for terms in (50 | 1 << 8 | 50 << 32, 50 | 1 << 8 | 2_000_000 << 32, 50 | 1 << 24):
        share = ArbiterShare.new()
        with pytest.raises(DeviceError, match="malformed"):
            arb._ask(REGISTER, share.share_id, share.key, os.getuid(), terms, uuid_bytes(uuid))
    # the arbiter is still there and takes a good one
    arb.register(Reg(ArbiterShare.new(), os.getuid(), (uuid,), 50, "high", "cap", 100))
