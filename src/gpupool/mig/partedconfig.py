"""Read and write NVIDIA mig-parted's config YAML (`version: v1`, `mig-configs`), with lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.core.errors import ConfigError, InvalidRequest, MigLayoutError, not_utf8
from gpupool.mig.catalog import GpuModel, find_model_by_pci_device_id, normalize_pci_device_id

VERSION = "v1"
_ENTRY_KEYS = ("devices", "mig-enabled", "mig-devices", "device-filter")


@dataclass(frozen=True)
class DeviceEntry:
    """One entry of a named config: which GPUs, MIG on or off, and the instances per GPU."""

    #: GPU indices, or None for `devices: all`
    devices: tuple[int, ...] | None
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...] = ()
    #: PCI device ids (`0x233010DE`); empty = any GPU
    device_filter: tuple[str, ...] = ()
    #: 1-based line of the entry in its file (0 when built in code); not part of equality
    line: int = field(default=0, compare=False)

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.mig_devices)


@dataclass(frozen=True)
class PartedConfig:
    """A whole mig-parted file: config name -> entries, in file order."""

    configs: tuple[tuple[str, tuple[DeviceEntry, ...]], ...]
    source: str = field(default="<config>", compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.configs)

    def entries(self, name: str) -> tuple[DeviceEntry, ...]:
        """The entries of config `name`, or ConfigError listing the names the file has."""
        for candidate, entries in self.configs:
            if candidate == name:
                return entries
        raise ConfigError(
            f"{self.source}: no MIG config named {name!r}; "
            f"the file has: {', '.join(self.names) or '(none)'}"
        )


# --- reading -------------------------------------------------------------------------------


class _Reader:
    """Turns the composed YAML node tree into a PartedConfig, naming the line of each problem."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.loader = yaml.SafeLoader(text)

    def fail(self, node: yaml.Node, message: str) -> ConfigError:
        return ConfigError(f"{self.source}:{node.start_mark.line + 1}: {message}")

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, "expected a single value here")
        return self.loader.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        items: list[tuple[str, yaml.Node, yaml.Node]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail(key_node, f"a key in {what} must be a plain name")
            # the text as written: YAML 1.1 would turn a config named `off` into False
            key = str(key_node.value)
            if key in seen:
                raise self.fail(key_node, f"{key!r} appears twice in {what}")
            seen.add(key)
            items.append((key, key_node, value_node))
        return items

    def read(self) -> PartedConfig:
        try:
            root = self.loader.get_single_node()
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            line = mark.line + 1 if mark is not None else 0
            raise ConfigError(f"{self.source}:{line}: malformed YAML: {err.problem}") from err
        except yaml.YAMLError as err:
            raise ConfigError(f"{self.source}: malformed YAML: {err}") from err
        finally:
            self.loader.dispose()
        if root is None:
            raise ConfigError(f"{self.source}: empty file; expected version and mig-configs")
        top = {key: (key_node, value) for key, key_node, value in self.mapping(root, "the file")}
        if "version" not in top:
            raise self.fail(root, "missing 'version' (mig-parted files say version: v1)")
        version = str(self.scalar(top["version"][1]))
        if version != VERSION:
            raise self.fail(top["version"][1], f"version {version!r} is not supported; use v1")
        if "mig-configs" not in top:
            raise self.fail(root, "missing 'mig-configs'")
        for key, (key_node, _) in top.items():
            if key not in ("version", "mig-configs"):
                raise self.fail(key_node, f"unknown key {key!r} (expected version, mig-configs)")
        configs = []
        for name, _, value in self.mapping(top["mig-configs"][1], "mig-configs"):
            configs.append((name, self.entries(name, value)))
        return PartedConfig(tuple(configs), self.source)

    def entries(self, name: str, node: yaml.Node) -> tuple[DeviceEntry, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"config {name!r} must be a list of device entries")
        return tuple(self.entry(name, item) for item in node.value)

    def entry(self, name: str, node: yaml.Node) -> DeviceEntry:
        fields = {key: (key_node, value) for key, key_node, value in self.mapping(node, name)}
        for key, (key_node, _) in fields.items():
            if key not in _ENTRY_KEYS:
                raise self.fail(
                    key_node, f"unknown key {key!r} in {name!r}; known: {', '.join(_ENTRY_KEYS)}"
                )
        for required in ("devices", "mig-enabled"):
            if required not in fields:
                raise self.fail(node, f"an entry of {name!r} lacks {required!r}")
        enabled = self.scalar(fields["mig-enabled"][1])
        if not isinstance(enabled, bool):
            raise self.fail(fields["mig-enabled"][1], "mig-enabled must be true or false")
        mig_devices = self.mig_devices(fields["mig-devices"][1]) if "mig-devices" in fields else ()
        device_filter = (
            self.device_filter(fields["device-filter"][1]) if "device-filter" in fields else ()
        )
        return DeviceEntry(
            devices=self.devices(fields["devices"][1]),
            mig_enabled=enabled,
            mig_devices=mig_devices,
            device_filter=device_filter,
            line=node.start_mark.line + 1,
        )

    def devices(self, node: yaml.Node) -> tuple[int, ...] | None:
        if isinstance(node, yaml.ScalarNode):
            value = self.scalar(node)
            if value == "all":
                return None
            values = [value]
        elif isinstance(node, yaml.SequenceNode):
            values = [self.scalar(item) for item in node.value]
        else:
            raise self.fail(node, "devices must be 'all' or a list of GPU indices")
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise self.fail(node, f"devices must be 'all' or a list of GPU indices, not {values}")
        if any(v < 0 for v in values):
            raise self.fail(node, "a GPU index must not be negative")
        return tuple(values)

    def mig_devices(self, node: yaml.Node) -> tuple[tuple[str, int], ...]:
        pairs = []
        for profile, _, value_node in self.mapping(node, "mig-devices"):
            count = self.scalar(value_node)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise self.fail(value_node, f"the count of {profile!r} must be a whole number")
            pairs.append((profile, count))
        return tuple(pairs)

    def device_filter(self, node: yaml.Node) -> tuple[str, ...]:
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        ids = []
        for item in items:
            value = self.scalar(item)
            # unquoted 0x233010DE is a YAML integer already; a quoted one is hex text
            raw = value if isinstance(value, int) and not isinstance(value, bool) else str(value)
            try:
                ids.append(normalize_pci_device_id(raw))
            except InvalidRequest as err:
                raise self.fail(item, str(err)) from err
        return tuple(ids)


def parse_config(text: str, source: str = "<config>") -> PartedConfig:
    """Parse mig-parted YAML; every error names `source` and the line."""
    return _Reader(text, source).read()


def load_config(path: Path) -> PartedConfig:
    """Read a mig-parted config file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read MIG config {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise not_utf8(str(path), err) from None
    return parse_config(text, str(path))


# --- writing -------------------------------------------------------------------------------


def _entry_data(entry: DeviceEntry) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if entry.device_filter:
        filters = list(entry.device_filter)
        data["device-filter"] = filters[0] if len(filters) == 1 else filters
    data["devices"] = "all" if entry.devices is None else list(entry.devices)
    data["mig-enabled"] = entry.mig_enabled
    if entry.mig_enabled:
        data["mig-devices"] = dict(entry.mig_devices)
    return data


def dump_config(config: PartedConfig) -> str:
    """The config as mig-parted YAML (key order as mig-parted's own examples)."""
    data = {
        "version": VERSION,
        "mig-configs": {
            name: [_entry_data(entry) for entry in entries] for name, entries in config.configs
        },
    }
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


# --- matching a config to a node's GPUs ----------------------------------------------------


@dataclass(frozen=True)
class GpuIdentity:
    """What matching needs to know of a GPU: its index, catalog model, and PCI device id."""

    index: int
    model: GpuModel | None
    pci_device_id: str | None = None


@dataclass(frozen=True)
class GpuTarget:
    """The state one GPU should reach under a config, and the entry that says so."""

    index: int
    model: GpuModel
    mig_enabled: bool
    counts: Mapping[str, int]
    line: int


def _matches(entry: DeviceEntry, gpu: GpuIdentity) -> bool:
    if entry.devices is not None and gpu.index not in entry.devices:
        return False
    if not entry.device_filter:
        return True
    if gpu.pci_device_id is not None:
        return normalize_pci_device_id(gpu.pci_device_id) in entry.device_filter
    # without the board's own id, a filter matches the models it names
    return any(find_model_by_pci_device_id(f) is gpu.model for f in entry.device_filter)


def targets(config: PartedConfig, name: str, gpus: Sequence[GpuIdentity]) -> list[GpuTarget]:
    """Per GPU, the target of config `name`; GPUs no entry matches are left out (unchanged).

    A GPU two entries match, an index the node lacks, or a profile the GPU's model does not
    have is an error naming the GPU, the profile and the line.
    """
    entries = config.entries(name)
    known = {gpu.index for gpu in gpus}
    chosen: dict[int, tuple[DeviceEntry, GpuIdentity]] = {}
    for entry in entries:
        missing = [i for i in entry.devices or () if i not in known]
        if missing:
            raise MigLayoutError(
                f"{config.source}:{entry.line}: config {name!r} names GPU {missing[0]}; "
                f"this node has GPUs {', '.join(map(str, sorted(known))) or '(none)'}"
            )
        for gpu in gpus:
            if not _matches(entry, gpu):
                continue
            if gpu.index in chosen:
                raise ConfigError(
                    f"{config.source}:{entry.line}: GPU {gpu.index} is also matched by the "
                    f"entry at line {chosen[gpu.index][0].line} of config {name!r}"
                )
            chosen[gpu.index] = (entry, gpu)
    return [_target(config, name, entry, gpu) for entry, gpu in chosen.values()]


def _target(config: PartedConfig, name: str, entry: DeviceEntry, gpu: GpuIdentity) -> GpuTarget:
    where = f"{config.source}:{entry.line}: config {name!r}"
    if gpu.model is None:
        raise ConfigError(f"{where}: GPU {gpu.index} is not a MIG-capable model gpupool knows")
    counts: dict[str, int] = {}
    for profile, count in entry.mig_devices:
        if not gpu.model.has_profile(profile):
            raise MigLayoutError(
                f"{where}: GPU {gpu.index} ({gpu.model.name}) has no MIG profile {profile!r}; "
                f"its profiles: {', '.join(gpu.model.profile_names)}"
            )
        counts[gpu.model.profile(profile).name] = count
    if not entry.mig_enabled and any(counts.values()):
        raise ConfigError(f"{where}: GPU {gpu.index} lists mig-devices with mig-enabled: false")
    return GpuTarget(gpu.index, gpu.model, entry.mig_enabled, counts, entry.line)
