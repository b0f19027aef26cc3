"""The simulated GPUs accept exactly the MIG layouts the planner calls valid, for every model."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.errors import InvalidRequest, MigLayoutError
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.mig import catalog
from gpupool.mig.planner import Placement, validate_layout

ALL_MODELS = ",".join(f"1x{model.name}" for model in catalog.MODELS)


def _planner_accepts(model: catalog.GpuModel, placements: list[Placement]) -> bool:
    try:
        validate_layout(model, placements)
    except MigLayoutError:
        return False
    return True


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    index=st.integers(0, len(catalog.MODELS) - 1),
    attempts=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 7)), min_size=1, max_size=10),
)
def test_create_succeeds_exactly_when_the_planner_says_it_fits(
    sim_node_dir: Path, index: int, attempts: list[tuple[int, int]]
) -> None:
    model = catalog.MODELS[index]
    with SimulatedBackend.open(ALL_MODELS, sim_node_dir) as backend:
        backend.set_mig_mode(index, True)
        mig = backend.snapshot().gpus[index].mig
        assert mig is not None
        for instance in mig.instances:  # examples share the node: start from an empty GPU
            backend.destroy_gpu_instance(index, instance.gi_id)
        placed: list[Placement] = []
        for profile_number, start in attempts:
            profile = model.profiles[profile_number % len(model.profiles)]
            wanted = Placement(start, profile.name)
            expected = _planner_accepts(model, [*placed, wanted])
            try:
                backend.create_gpu_instance(index, profile.name, start)
            except InvalidRequest:
                assert not expected, f"simulated GPU refused {wanted} after {placed}"
                continue
            assert expected, f"simulated GPU accepted {wanted} after {placed}"
            placed.append(wanted)
