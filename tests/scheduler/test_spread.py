"""The spread preference: a share avoids the GPUs it is asked to (replicas of one service) when
it fits elsewhere, and packs as usual when it does not."""

from __future__ import annotations

import pytest

from gpupool.core.units import GiB
from gpupool.scheduler import POLICY_NAMES
from gpupool.scheduler.gpu_placement import place
from gpupool.scheduler.gpus import GpuRequest, GpuView, take

SHARE = GpuRequest(1, 200, 4 * GiB)


def node(count: int = 3) -> tuple[GpuView, ...]:
    return tuple(GpuView.idle(i, "A100-40GB", 40 * GiB) for i in range(count))


def test_binpack_packs_without_avoid_and_spreads_with_it() -> None:
    busy = take(node(), SHARE, (1,))
    assert place(SHARE, busy, "binpack").gpus == (1,)  # the fullest GPU
    assert place(SHARE, busy, "binpack", avoid={1}).gpus == (0,)
    # among the GPUs not avoided, the policy still packs: the fullest of them
    busier = take(busy, SHARE, (2,))
    busier = take(busier, SHARE, (2,))
    assert place(SHARE, busier, "binpack", avoid={1}).gpus == (2,)


def test_an_avoided_gpu_is_taken_when_no_other_fits() -> None:
    full = GpuRequest(1, 1000, 40 * GiB)
    gpus = take(node(2), full, (0,))
    assert place(SHARE, gpus, "binpack", avoid={1}).gpus == (1,)
    # every GPU avoided: placed as without the preference
    assert place(SHARE, node(2), "binpack", avoid={0, 1}).gpus == place(SHARE, node(2)).gpus


def test_avoid_never_turns_a_fit_into_a_misfit_nor_a_misfit_into_a_fit() -> None:
    huge = GpuRequest(1, 200, 41 * GiB)
    assert not place(huge, node(), avoid={0}).fits
    two = GpuRequest(2, 200, 4 * GiB)
    assert place(two, node(3), avoid={0}).gpus == (1, 2)
    assert place(two, node(2), avoid={0}).gpus == (0, 1)  # spreading needs both: takes them


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_honours_the_preference(policy: str) -> None:
    gpus = take(node(), SHARE, (0,))
    for avoided in ({0}, {0, 1}, {1, 2}):
        chosen = place(SHARE, gpus, policy, avoid=avoided).gpus
        assert chosen is not None and chosen[0] not in avoided, (policy, avoided)
