"""The agent's observations: fixed-bucket histograms and the bounded utilisation ring."""

from __future__ import annotations

from gpupool.agent.observe import Histogram, Observations
from gpupool.devices.snapshot import GpuSnapshot, NodeSnapshot


def _snapshot(at: float, utilization: int) -> NodeSnapshot:
    gpu = GpuSnapshot(
        0, "GPU-0", "A30", "A30", "0000:01:00.0", 24, 0, 24, utilization, 40, 60.0, None
    )
    return NodeSnapshot(at, True, "sim", (gpu,))


def test_a_histogram_counts_cumulatively_with_an_inf_bucket() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    reading = histogram.read()
    assert reading.buckets == ((0.1, 2), (1.0, 3), (float("inf"), 4))
    assert reading.count == 4 and abs(reading.total - 3.65) < 1e-9


def test_the_ring_keeps_only_the_last_minutes() -> None:
    observed = Observations(history_s=10, sample_s=1.0)
    for second in range(25):
        observed.sampled(_snapshot(float(second), second), {})
    points = observed.recent()
    assert len(points) == 10 and points[0].at == 15.0 and points[-1].utilization == (24,)
    assert [p.at for p in observed.recent(since=22.0)] == [23.0, 24.0]
