"""Opening a node's GPUs: the one module that knows both backends."""

from __future__ import annotations

import os
from pathlib import Path

from gpupool.core import settings
from gpupool.devices.backend import GpuBackend


def open_backend(simulate: str | None, node_dir: Path | None = None) -> GpuBackend:
    """The simulated node of spec `simulate`, else NVML.

    `simulate` is a spec (`8xH100-80GB`, `4xA30,2xA100-40GB`, a YAML inventory path). Without
    one, `node_dir` or $GPUPOOL_SIM_NODE (set for processes on the simulated driver) opens an
    existing simulated node; with neither, the real GPUs through NVML.
    """
    # imported here so that NVML users never load the simulated node and vice versa
    if simulate is None and node_dir is None and settings.SIM_NODE.read(os.environ) is None:
        from gpupool.devices.nvml import NvmlBackend

        return NvmlBackend()
    from gpupool.devices.sim.backend import SimulatedBackend

    return SimulatedBackend.open(simulate, node_dir)
