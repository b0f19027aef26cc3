"""Simulated nodes made from a spec for `gpupool exec --simulate`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import GiB
from gpupool.isolation.simnode import (
    MODELS,
    create_sim_node,
    default_node_dir,
    open_or_create_sim_node,
    parse_sim_spec,
)


def test_specs() -> None:
    assert [m.model for m in parse_sim_spec("2xH100")] == ["H100-80GB", "H100-80GB"]
    assert [m.model for m in parse_sim_spec("1xA100-40GB, 1xa30")] == ["A100-40GB", "A30-24GB"]
    assert [m.model for m in parse_sim_spec("h200")] == ["H200-141GB"]
    assert parse_sim_spec("B200")[0].memory == 180 * GiB


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("2xV100", "unknown GPU model 'V100' .*H100-80GB"),
        ("0xH100", "at least 1 GPU"),
        ("17xH100", "at most 16 GPUs"),
        ("2 H100", "COUNTxMODEL"),
        ("", "COUNTxMODEL"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_sim_spec(spec)


def test_default_node_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPUPOOL_SIM_NODE", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_node_dir("2xH100") == tmp_path / f"gpupool-sim-{os.getuid()}" / "2xH100"
    assert default_node_dir("1x A30/x").name == "1x_A30_x"
    monkeypatch.setenv("GPUPOOL_SIM_NODE", str(tmp_path / "mine"))
    assert default_node_dir("2xH100") == tmp_path / "mine"


def test_created_node(tmp_path: Path) -> None:
    state = create_sim_node("1xA30,1xB200", tmp_path)
    a30, b200 = state.gpus()
    assert (a30.name, a30.memory_total, a30.sm_count, a30.cc_major) == (
        MODELS["A30-24GB"].name,
        24 * GiB,
        56,
        8,
    )
    assert (b200.model, b200.cc_major, b200.pci_bus_id) == ("B200-180GB", 10, "00000000:27:00.0")
    assert a30.uuid.startswith("GPU-") and a30.uuid != b200.uuid
    again = create_sim_node("1xA30,1xB200", tmp_path)
    assert [g.uuid for g in again.gpus()] == [a30.uuid, b200.uuid]  # stable per directory


def test_a_matching_node_is_reused_and_another_replaced(tmp_path: Path) -> None:
    state = create_sim_node("1xH100", tmp_path)
    state.set_gpu_usage(0, memory_used=5, busy_ns_total=7)
    reused = open_or_create_sim_node("H100", tmp_path)
    assert reused.gpu(0).memory_used == 5  # the same node, counters kept
    replaced = open_or_create_sim_node("2xH100", tmp_path)
    assert [g.memory_used for g in replaced.gpus()] == [0, 0]
    (tmp_path / "state.bin").write_bytes(b"junk")
    assert open_or_create_sim_node("1xH100", tmp_path).gpu_count == 1
