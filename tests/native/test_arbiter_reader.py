"""Reading the GPUs' compute arbiters (gpupool.isolation.arbiter) while shares are busy at once on
one simulated GPU: each share's percent, priority, process and measured GPU use."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from shim_support import PROGS, compile_prog, make_node, shim_env, start_client

from gpupool.core.errors import ConfigError
from gpupool.isolation.arbiter import (
    FILE_SIZE,
    HEADER,
    MAGIC,
    VERSION,
    arbiter_file,
    compute_use,
    find_share,
    live_shares,
    read_shares,
)
from gpupool.isolation.region import region_share_id

GPU = "GPU-5f3e2a10-0b1c-4d2e-8f90-123456789abc"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


def test_two_busy_shares_show_their_use_against_their_share(client: Path, tmp_path: Path) -> None:
    node = make_node(tmp_path / "node", uuids=[GPU])
    procs = {}
    for percent, priority in ((30, "high"), (70, "low")):
        env = shim_env(
            node,
            COMPUTE_LIMIT=str(percent),
            COMPUTE_PRIORITY=priority,
            SHARED_REGION=str(tmp_path / f"region-{percent}"),
        )
        procs[percent] = start_client(client, env, "run", 4, "kernel")
    try:
        time.sleep(1.0)
        (uses,) = compute_use([arbiter_file(node, GPU)], 1.5)
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
    # the share's own region names its slot, where its measured time stays after it ended
    for percent in procs:
        share_id = region_share_id(tmp_path / f"region-{percent}")
        assert share_id is not None
        slot = find_share(node, GPU, share_id)
        assert slot is not None and slot.percent == percent
        assert 0.6 * percent / 100 * 4e9 <= slot.busy_ns <= 1.2 * percent / 100 * 4e9, slot
    assert live_shares(arbiter_file(node, GPU)) == []  # both ended


def test_a_gpu_without_an_arbiter_has_no_shares(tmp_path: Path) -> None:
    assert read_shares(arbiter_file(tmp_path, GPU)) == []
    assert compute_use([arbiter_file(tmp_path, GPU)], 0.01) == [[]]
    assert region_share_id(tmp_path / "no-region") is None


@pytest.mark.parametrize("size", [0, FILE_SIZE])
def test_an_arbiter_its_first_process_has_not_yet_initialised_has_no_shares(
    tmp_path: Path, size: int
) -> None:
    """The library creates the file, sizes it, then writes it: `gpupool gpus` reading it in
    between sees no shares, not an arbiter of another version."""
    path = arbiter_file(tmp_path, GPU)
    path.write_bytes(bytes(size))
    assert read_shares(path) == []


@pytest.mark.parametrize(
    "content",
    [HEADER.pack(MAGIC, VERSION - 1, FILE_SIZE).ljust(FILE_SIZE, b"\0"), b"not an arbiter"],
    ids=["older version", "another file"],
)
def test_an_arbiter_of_another_version_is_refused_with_one_line(
    tmp_path: Path, content: bytes
) -> None:
    path = arbiter_file(tmp_path, GPU)
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_shares(path)
    assert str(err.value) == (
        f"{path} is not a compute arbiter of this gpupool version (it reads version 3): remove "
        "it when no workload runs on this GPU"
    )
