"""An online (`high`) service's replicas hold the compute arbiter's short time slice, an offline
(`low`) one's the batch window: a real daemon on a simulated node, real replicas, the slices read
from the arbiter's own view of the GPU (what it hands leases by), and again after the arbiter
was killed and the daemon registered the running replicas with a new one."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from tests.agent.daemon_support import until
from tests.agent.services_support import Routed, routed_on

from gpupool.agent.jobs import JobSpec
from gpupool.agent.services import LATENCY_SLICE_US, ServiceSpec
from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Priority
from gpupool.devices.sim.state import STATE_FILE, SimState
from gpupool.isolation.arbiter import read_shares, view_file
from gpupool.isolation.arbiter_control import node_arbiter_dir

routed = routed_on("1xA100-40GB")


def slices(routed: Routed) -> set[tuple[str | None, int]]:
    """Each registered share's priority and slice on the node's GPU."""
    state = SimState.open(routed.daemon.node_dir / STATE_FILE)
    try:
        uuid = state.gpu(0).uuid
    finally:
        state.close()
    view = view_file(node_arbiter_dir(routed.daemon.node_dir), uuid)
    return {(share.priority, share.slice_us) for share in read_shares(view)}


@pytest.mark.serial
def test_online_replicas_get_the_short_slice_and_offline_ones_the_batch_window(
    routed: Routed,
) -> None:
    routed.create("chat", priority="high")
    routed.create("score", priority="low")
    routed.ready("chat")
    routed.ready("score")
    wanted = {("high", LATENCY_SLICE_US), ("low", 0)}
    assert slices(routed) == wanted
    # the daemon starts a killed arbiter again and registers the replicas on the same terms
    directory = node_arbiter_dir(routed.daemon.node_dir)
    os.kill(arbiter_pid(directory), signal.SIGKILL)
    assert until(lambda: arbiter_pid(directory) != 0 and slices(routed) == wanted, timeout=15)


def arbiter_pid(directory: Path) -> int:
    """The pid of the arbiter serving `directory` (0: none)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if argv and argv[0].endswith(b"gpupool-arbiterd") and argv[1:2] == [bytes(directory)]:
            return int(proc.name)
    return 0


def test_a_replica_s_slice_follows_its_priority_and_is_stored_with_its_job() -> None:
    online = ServiceSpec("chat", ("server",), priority=Priority.HIGH).replica(8000)
    offline = ServiceSpec("score", ("server",), priority=Priority.LOW).replica(8001)
    assert (online.slice_us, offline.slice_us) == (LATENCY_SLICE_US, 0)
    assert JobSpec.from_json(online.to_json()) == online
    stored = online.to_json()
    del stored["slice_us"]  # a job stored before slices: the batch window
    assert JobSpec.from_json(stored).slice_us == 0
    for wrong in (50, 2_000_000):
        with pytest.raises(InvalidRequest, match="time slice"):
            JobSpec(argv=("server",), slice_us=wrong)
