"""Simulated nodes for `gpupool exec --simulate`: a spec such as `2xH100` becomes a node directory.

Interim: the devices layer's simulated backend (devices/simulated.py) owns the model catalogue and
node.json; when it is on this branch, `create_sim_node` is to be replaced by it. Until then this
module writes state.bin only, through gpupool.devices.simstate, from the small table below.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import DeviceError, InvalidRequest
from gpupool.core.units import GiB
from gpupool.devices.simstate import MAX_GPUS, STATE_FILE, SimGpuSpec, SimState


@dataclass(frozen=True)
class SimModel:
    """What the simulated driver reports of one GPU model."""

    model: str
    name: str
    memory: int
    sm_count: int
    cc_major: int
    cc_minor: int


MODELS: dict[str, SimModel] = {
    m.model: m
    for m in (
        SimModel("A30-24GB", "NVIDIA A30", 24 * GiB, 56, 8, 0),
        SimModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40 * GiB, 108, 8, 0),
        SimModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 80 * GiB, 108, 8, 0),
        SimModel("H100-80GB", "NVIDIA H100 80GB HBM3", 80 * GiB, 132, 9, 0),
        SimModel("H100-94GB", "NVIDIA H100 NVL", 94 * GiB, 132, 9, 0),
        SimModel("H200-141GB", "NVIDIA H200", 141 * GiB, 132, 9, 0),
        SimModel("B200-180GB", "NVIDIA B200", 180 * GiB, 148, 10, 0),
    )
}

#: short names people type: `H100` is the 80 GB part
ALIASES = {
    "A30": "A30-24GB",
    "A100": "A100-80GB",
    "H100": "H100-80GB",
    "H200": "H200-141GB",
    "B200": "B200-180GB",
}

_GROUP = re.compile(r"^(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9-]+)$")


def _model(name: str, spec: str) -> SimModel:
    key = {m.upper(): m for m in MODELS} | {a.upper(): m for a, m in ALIASES.items()}
    found = key.get(name.upper())
    if found is None:
        known = ", ".join(sorted(MODELS))
        raise InvalidRequest(
            f"invalid simulated node {spec!r}: unknown GPU model {name!r} (known: {known})"
        )
    return MODELS[found]


def parse_sim_spec(spec: str) -> list[SimModel]:
    """`2xH100`, `1xA100-40GB,1xA30` -> one SimModel per GPU, in order."""
    gpus: list[SimModel] = []
    for group in spec.split(","):
        match = _GROUP.match(group.strip())
        if match is None:
            raise InvalidRequest(
                f"invalid simulated node {spec!r}: write COUNTxMODEL groups, e.g. 2xH100"
            )
        count = int(match.group(1) or "1")
        if count < 1:
            raise InvalidRequest(f"invalid simulated node {spec!r}: a group needs at least 1 GPU")
        gpus.extend([_model(match.group(2), spec)] * count)
    if len(gpus) > MAX_GPUS:
        raise InvalidRequest(f"invalid simulated node {spec!r}: at most {MAX_GPUS} GPUs")
    return gpus


def default_node_dir(spec: str) -> Path:
    """GPUPOOL_SIM_NODE when set, else a per-user directory named after the spec."""
    configured = os.environ.get("GPUPOOL_SIM_NODE")
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    safe = re.sub(r"[^A-Za-z0-9.,-]", "_", spec)
    return Path(runtime) / f"gpupool-sim-{os.getuid()}" / safe


def _gpu_spec(index: int, model: SimModel, node_dir: Path) -> SimGpuSpec:
    # stable per node directory and index, so a node keeps its UUIDs across re-creation
    gpu_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"gpupool-sim:{node_dir.resolve()}:{index}")
    return SimGpuSpec(
        uuid=f"GPU-{gpu_uuid}",
        name=model.name,
        model=model.model,
        memory_total=model.memory,
        sm_count=model.sm_count,
        cc_major=model.cc_major,
        cc_minor=model.cc_minor,
        pci_bus_id=f"00000000:{0x17 + index * 0x10:02X}:00.0",
    )


def create_sim_node(spec: str, node_dir: Path) -> SimState:
    """A fresh simulated node for `spec` in `node_dir` (its state file is replaced)."""
    models = parse_sim_spec(spec)
    gpus = [_gpu_spec(i, model, node_dir) for i, model in enumerate(models)]
    return SimState.create(node_dir / STATE_FILE, gpus)


def open_or_create_sim_node(spec: str, node_dir: Path) -> SimState:
    """The node in `node_dir` when it already has the GPUs of `spec`, else a fresh one.

    Reusing it lets several commands started with the same spec share the simulated GPUs.
    """
    models = [m.model for m in parse_sim_spec(spec)]
    state_path = node_dir / STATE_FILE
    if state_path.is_file():
        try:
            state = SimState.open(state_path)
        except DeviceError:
            pass  # not a current state file: replace it
        else:
            if [g.model for g in state.gpus()] == models:
                return state
            state.close()
    return create_sim_node(spec, node_dir)
