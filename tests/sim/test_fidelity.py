"""Fidelity on the real trace: fgd and bestfit land near the FGD paper's published means."""

from __future__ import annotations

import pytest

from gpupool.sim import trace
from gpupool.sim.runner import Scenario, plan, run_many

TRACE_DIR = trace.default_trace_dir()

# The paper's mean unallocated GPU % at 100 % arrived on `default` over seeds 42-51
# (fgd_published_default.csv beside the trace); seed-to-seed spread is 0.1 to 0.6 points.
PUBLISHED_AT_100 = {"fgd": 4.773, "bestfit": 7.138}


@pytest.mark.skipif(
    TRACE_DIR is None,
    reason=f"no Alibaba trace at {trace.DEFAULT_TRACE_RELPATH} (download: {trace.TRACE_URL})",
)
def test_fgd_and_bestfit_match_the_published_means_within_a_point() -> None:
    assert TRACE_DIR is not None
    results = run_many(
        Scenario(trace_dir=TRACE_DIR), plan(["default"], list(PUBLISHED_AT_100), [42]), jobs=2
    )
    for result in results:
        assert 10_700 <= result.pods <= 10_900  # the paper's "about 10.8k pods"
        ours = result.curves.at(100)
        published = PUBLISHED_AT_100[result.spec.policy]
        assert abs(ours - published) <= 1.0, (result.spec.policy, ours, published)
