"""mig-parted config YAML: parse, errors with lines, round trip, matching to a node's GPUs."""

from pathlib import Path

import pytest

from gpupool.core.errors import ConfigError, MigLayoutError
from gpupool.mig.catalog import get_model
from gpupool.mig.partedconfig import (
    DeviceEntry,
    GpuIdentity,
    PartedConfig,
    dump_config,
    load_config,
    parse_config,
    targets,
)

EXAMPLE = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-balanced:
    - device-filter: ["0x233010DE", "0x233110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1

  custom:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
"""


def test_parse_the_mig_parted_shape() -> None:
    config = parse_config(EXAMPLE, "example.yaml")
    assert config.names == ("all-disabled", "all-balanced", "custom")
    disabled = config.entries("all-disabled")
    assert disabled == (DeviceEntry(devices=None, mig_enabled=False),)
    balanced = config.entries("all-balanced")
    assert balanced[0].device_filter == ("0x233010DE", "0x233110DE")
    assert balanced[0].counts == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert balanced[0].line == 8
    assert balanced[1].device_filter == ("0x20B710DE",)
    assert config.entries("custom")[0].devices == (0, 1)


def test_round_trip(tmp_path: Path) -> None:
    config = parse_config(EXAMPLE)
    text = dump_config(config)
    assert parse_config(text) == config
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert load_config(path) == config
    assert "device-filter: '0x20B710DE'" in text  # quoted: YAML would read 0x.. as int


def test_unquoted_device_filter_is_read_as_hex() -> None:
    text = "version: v1\nmig-configs:\n  a:\n    - device-filter: 0x233010DE\n"
    text += "      devices: all\n      mig-enabled: false\n"
    assert parse_config(text).entries("a")[0].device_filter == ("0x233010DE",)


def test_unknown_config_name_lists_the_names() -> None:
    config = parse_config(EXAMPLE, "example.yaml")
    with pytest.raises(
        ConfigError, match=r"no MIG config named 'nope'.*all-disabled, all-balanced"
    ):
        config.entries("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v1\nmig-configs:\n  a:\n    - devices: [0\n", r"cfg.yaml:5: malformed YAML"),
        ("version: v1\nmig-configs:\n  a: {b: 1\n", r"cfg.yaml:4: malformed YAML"),
        ("version: v2\nmig-configs: {}\n", r"cfg.yaml:1: version 'v2' is not supported"),
        ("mig-configs: {}\n", r"cfg.yaml:1: missing 'version'"),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: yes please\n",
            r"cfg.yaml:5: mig-enabled must be true or false",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devices: {'1g.10gb': -1}\n",
            r"cfg.yaml:6: the count of '1g.10gb' must be a whole number",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      migdevices: {}\n",
            r"cfg.yaml:6: unknown key 'migdevices'",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: [gpu0]\n      mig-enabled: true\n",
            r"cfg.yaml:4: devices must be 'all' or a list of GPU indices",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      device-filter: nonsense\n",
            r"cfg.yaml:6: invalid PCI device id 'nonsense'",
        ),
        ("", r"cfg.yaml: empty file"),
    ],
)
def test_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text, "cfg.yaml")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read MIG config"):
        load_config(tmp_path / "absent.yaml")


NODE = [
    GpuIdentity(0, get_model("H100-80GB")),
    GpuIdentity(1, get_model("H100-80GB")),
    GpuIdentity(2, get_model("A30")),
]


def test_targets_follow_device_filter_by_model() -> None:
    config = parse_config(EXAMPLE, "example.yaml")
    found = {t.index: t for t in targets(config, "all-balanced", NODE)}
    assert found[0].counts == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert found[2].counts == {"1g.6gb": 2, "2g.12gb": 1}
    assert found[2].line == 15


def test_targets_filter_by_the_boards_own_pci_id() -> None:
    config = parse_config(EXAMPLE)
    pcie = [GpuIdentity(0, get_model("H100"), "0x233110de"), GpuIdentity(1, get_model("H100"), "1")]
    assert [t.index for t in targets(config, "all-balanced", pcie)] == [0]


def test_profile_of_another_model_names_gpu_and_profile() -> None:
    config = parse_config(EXAMPLE, "example.yaml")
    node = [GpuIdentity(0, get_model("H100")), GpuIdentity(1, get_model("A30"))]
    with pytest.raises(MigLayoutError, match=r"example.yaml:23:.*GPU 1 \(A30-24GB\).*'3g.40gb'"):
        targets(config, "custom", node)


def test_index_the_node_lacks_and_double_match() -> None:
    config = parse_config(EXAMPLE, "example.yaml")
    with pytest.raises(MigLayoutError, match="names GPU 1; this node has GPUs 0"):
        targets(config, "custom", [GpuIdentity(0, get_model("H100"))])
    doubled = PartedConfig(
        (("x", (DeviceEntry(None, False, line=3), DeviceEntry((0,), False, line=5))),), "d.yaml"
    )
    with pytest.raises(
        ConfigError, match=r"d.yaml:5: GPU 0 is also matched by the entry at line 3"
    ):
        targets(doubled, "x", NODE)
