"""Simulated node specs: strings, YAML inventories, and the errors bad ones get."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpupool.core.errors import ConfigError, DeviceError, InvalidRequest
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.spec import default_node_dir, parse_spec


@pytest.mark.parametrize(
    ("text", "models"),
    [
        ("8xH100-80GB", ["H100-80GB"] * 8),
        ("4xA30-24GB,2xA100-40GB", ["A30-24GB"] * 4 + ["A100-40GB"] * 2),
        ("H100", ["H100-80GB"]),
        ("2XA30, 1xh200", ["A30-24GB", "A30-24GB", "H200-141GB"]),
        ("1xB200,1xH100-94GB,1xA100-80GB", ["B200-180GB", "H100-94GB", "A100-80GB"]),
    ],
)
def test_specs(text: str, models: list[str]) -> None:
    assert [g.model.name for g in parse_spec(text).gpus] == models


def test_same_gpus_same_key() -> None:
    assert parse_spec("2xA30").key == parse_spec("2xA30-24GB").key == parse_spec("A30,A30").key
    assert parse_spec("2xA30").key != parse_spec("3xA30").key


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2xA100", "'A100' is ambiguous: say A100-40GB or A100-80GB"),
        ("2xT4", "unknown GPU model 'T4'; known: A30-24GB, A100-40GB"),
        ("17xA30", "has 17 GPUs; a node holds 1 to 16"),
        ("0xA30", "GPU count 0"),
        ("2x", "unknown GPU model '2x'"),
        ("2 x", "'2 x' is not COUNTxMODEL"),
        ("2xA30,,", "'' is not COUNTxMODEL"),
    ],
)
def test_bad_specs_name_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec(text)
    assert message in str(caught.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return path


def test_yaml_inventory_with_mig_and_uuids(tmp_path: Path, sim_node_dir: Path) -> None:
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    path = write(
        tmp_path,
        f"""
gpus:
  - model: H100
    count: 1
    mig: [3g.40gb, {{profile: 4g.40gb, start: 0}}]
    uuids: [{uuid}]
  - model: A30
    count: 2
    mig: true
""",
    )
    spec = parse_spec(str(path))
    assert [g.model.name for g in spec.gpus] == ["H100-80GB", "A30-24GB", "A30-24GB"]
    with SimulatedBackend.open(str(path), sim_node_dir) as backend:
        h100, a30, _ = backend.snapshot().gpus
    assert h100.uuid == uuid
    assert h100.mig is not None
    assert [(i.profile, i.placement_start) for i in h100.mig.instances] == [
        ("4g.40gb", 0),
        ("3g.40gb", 4),
    ]
    assert a30.mig is not None and a30.mig.current and a30.mig.instances == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus:\n  - model: H100\n    count: [2\n", "line 4"),
        ("gpus: 3\n", "a mapping with a `gpus:` list"),
        ("gpus:\n  - count: 2\n", "gpus entry 1: needs `model:`"),
        ("gpus:\n  - model: H100\n    colour: red\n", "unknown key(s) colour"),
        ("gpus:\n  - model: A100\n", "gpus entry 1: GPU model 'A100' is ambiguous"),
        ("gpus:\n  - model: A30\n    count: -1\n", "count -1 must be a positive integer"),
        ("gpus:\n  - model: A30\n    mig: [3g.40gb]\n", "unknown MIG profile '3g.40gb' for A30"),
        ("gpus:\n  - model: A30\n    count: 2\n    uuids: [GPU-1]\n", "uuids must list 2"),
    ],
)
def test_bad_yaml_names_file_and_place(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        parse_spec(str(path))
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_yaml_layout_that_does_not_fit_names_the_gpu(tmp_path: Path, sim_node_dir: Path) -> None:
    path = write(tmp_path, "gpus:\n  - model: H100\n    mig: [4g.40gb, 4g.40gb]\n")
    with pytest.raises(
        ConfigError, match=r"GPU 0: 2 instances of 4g\.40gb on H100-80GB: at most 1"
    ):
        SimulatedBackend.open(str(path), sim_node_dir)


def test_missing_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read inventory"):
        parse_spec(str(tmp_path / "absent.yaml"))


def test_a_bare_word_is_a_model_even_if_a_file_has_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "A30").write_text("gpus: [{model: H100}]\n")
    (tmp_path / "inventory").write_text("gpus: [{model: H100}]\n")
    monkeypatch.chdir(tmp_path)
    assert [g.model.name for g in parse_spec("A30").gpus] == ["A30-24GB"]
    assert [g.model.name for g in parse_spec("./inventory").gpus] == ["H100-80GB"]


def test_default_base_planted_as_a_symlink_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "gpupool-sim").symlink_to(elsewhere)
    with pytest.raises(DeviceError, match="not a directory of this user"):
        default_node_dir(parse_spec("A30"))


def test_default_base_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # an ordinary user's own nodes
    node_dir = default_node_dir(parse_spec("A30"))
    assert node_dir.parent == tmp_path / "gpupool-sim"
    assert (node_dir.parent.stat().st_mode & 0o777) == 0o700


def test_roots_default_base_is_reachable_by_its_users_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    (tmp_path / "gpupool-sim").mkdir(mode=0o700)  # as an earlier gpupool made it
    node_dir = default_node_dir(parse_spec("A30"))
    # searchable by the jobs of a root daemon's users, listable and writable by root alone
    assert (node_dir.parent.stat().st_mode & 0o777) == 0o711


def test_an_inventory_that_is_not_utf8_is_one_line_naming_the_file(tmp_path: Path) -> None:
    inventory = tmp_path / "node.yaml"
    inventory.write_bytes(b"gpus:\n  - model: H100 # \xff\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(inventory))}:2: not UTF-8 text"):
        parse_spec(str(inventory))
