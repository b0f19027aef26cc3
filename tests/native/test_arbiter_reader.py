"""Reading the GPUs' views of the trusted arbiter (gpupool.isolation.arbiter) while shares are
busy at once on one simulated GPU: each share's percent, priority, process and charged GPU use."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from shim_support import PROGS, arbiter, compile_prog, make_node, register, shim_env, start_client

from gpupool.core.errors import ConfigError
from gpupool.isolation.arbiter import (
    FILE_SIZE,
    HEADER,
    MAGIC,
    VERSION,
    compute_use,
    find_share,
    lease_clients,
    live_shares,
    read_shares,
    view_file,
)

GPU = "GPU-5f3e2a10-0b1c-4d2e-8f90-123456789abc"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


#: how long the two busy shares run, in seconds
RUN_S = 6


@pytest.mark.serial
def test_two_busy_shares_show_their_use_against_their_share(client: Path, tmp_path: Path) -> None:
    node = make_node(tmp_path / "node", uuids=[GPU])
    procs, ids = {}, {}
    with arbiter(tmp_path / "arbiter") as (control, _pid):
        for percent, priority in ((30, "high"), (70, "low")):
            settings = register(control, GPU, percent, priority=priority)
            ids[percent] = int(settings["ARBITER_SHARE"].split(":")[0], 16)
            env = shim_env(
                node,
                COMPUTE_LIMIT=str(percent),
                COMPUTE_PRIORITY=priority,
                SHARED_REGION=str(tmp_path / f"region-{percent}"),
                **settings,
            )
            procs[percent] = start_client(client, env, "run", RUN_S, "kernel")
        view = view_file(control.directory, GPU)
        try:
            time.sleep(1.0)
            # a window of 3 s: over a shorter one, the shares' scheduling on 2 busy cores moves
            # their use by more than the tolerance
            (uses,) = compute_use([view], 3.0)
            clients = lease_clients(view)
        finally:
            for proc in procs.values():
                proc.communicate(timeout=30)
        by_percent = {use.share.percent: use for use in uses}
        assert sorted(by_percent) == [30, 70], uses
        # the low share gets what the capped high one leaves: its own 70 % cap
        assert abs(by_percent[30].used_percent - 30) <= 7, uses
        assert abs(by_percent[70].used_percent - 70) <= 7, uses
        assert by_percent[30].share.priority == "high" and by_percent[70].share.priority == "low"
        assert {p: by_percent[p].share.pid for p in procs} == {p: procs[p].pid for p in procs}
        assert all(use.share.policy == "cap" for use in uses)
        # the arbiter knows each share's process: the watchdog's list of lease holders
        assert {(c.pid, c.share_id) for c in clients} == {(procs[p].pid, ids[p]) for p in procs}
        # the share's slot stays while its registration does, with the lease time it was charged
        for percent in procs:
            slot = find_share(control.directory, GPU, ids[percent])
            assert slot is not None and slot.percent == percent
            assert (
                0.6 * percent / 100 * RUN_S * 1e9
                <= slot.busy_ns
                <= 1.2 * percent / 100 * RUN_S * 1e9
            ), slot
        assert live_shares(view) == []  # both ended
        assert lease_clients(view) == []


def test_a_gpu_without_a_view_has_no_shares(tmp_path: Path) -> None:
    assert read_shares(view_file(tmp_path, GPU)) == []
    assert lease_clients(view_file(tmp_path, GPU)) == []
    assert compute_use([view_file(tmp_path, GPU)], 0.01) == [[]]


@pytest.mark.parametrize(
    "content",
    [HEADER.pack(MAGIC, VERSION - 1, FILE_SIZE).ljust(FILE_SIZE, b"\0"), b"not an arbiter"],
    ids=["older version", "another file"],
)
def test_a_view_of_another_version_is_refused_with_one_line(tmp_path: Path, content: bytes) -> None:
    path = view_file(tmp_path, GPU)
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_shares(path)
    assert str(err.value) == (
        f"{path} is not a compute arbiter's view of this gpupool version "
        f"(it reads version {VERSION}): restart the arbiter (the node daemon does)"
    )


def test_a_view_that_is_not_the_arbiters_own_file_is_refused(tmp_path: Path) -> None:
    """Another user's file, or a link, where the arbiter keeps its view: never read."""
    path = view_file(tmp_path, GPU)
    path.write_bytes(bytes(FILE_SIZE))
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="is not the compute arbiter's view: ignored"):
        read_shares(path)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="cannot read the compute arbiter's view"):
        read_shares(path)
