"""The live target workload: the shapes recently submitted, in a decaying window over a prior.

A replay knows its whole workload in advance; a daemon or an extender only knows what was asked
of it so far. Each submitted share adds 1 to its shape's weight after every weight has been
multiplied by `DECAY`, so a shape asked N submissions ago weighs DECAY**N (half-life
HALF_LIFE submissions); the built-in prior starts with PRIOR_WEIGHT spread over its shapes and
decays the same way. The weights are a small JSON document the daemon keeps in its store, so a
restarted daemon resumes the window where it was.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.demand import Demand
from gpupool.scheduler.gpus import GpuRequest
from gpupool.scheduler.packing import SharePrices
from gpupool.scheduler.workload import (
    PRIOR,
    PodSpec,
    TargetWorkload,
    Widest,
    spec_of,
    wide_sizes,
)

#: submissions after which a shape's weight has halved
HALF_LIFE = 200
DECAY = 0.5 ** (1 / HALF_LIFE)
#: the prior's total weight at the start (as many submissions' worth)
PRIOR_WEIGHT = 20.0
#: shapes kept; the lightest go first (a hostile stream of distinct shapes stays bounded)
MAX_SHAPES = 64
#: the most GPUs a saved shape may ask (a node's GPU indices fit 32 slots)
MAX_SAVED_GPUS = 32
#: weights below this are forgotten
FORGET_BELOW = 1e-3
#: a target whose shapes' probabilities all moved less than this is not taken up in place of
#: the one a daemon or an extender places by (taking one up makes the caches kept for it cold)
TARGET_MOVED = 0.05


@functools.lru_cache(maxsize=4 * MAX_SHAPES)
def _saved(spec: PodSpec) -> dict[str, object]:
    """A shape's fields as saved (cached: a daemon saves its window after every submit, and
    `asdict` was the most of that)."""
    return {**asdict(spec), "gpu_models": list(spec.gpu_models)}


class RecentShapes:
    """Decaying weights of the shapes submitted; `target()` is the target workload they make."""

    def __init__(self, weights: dict[PodSpec, float] | None = None) -> None:
        if weights is None:
            share = PRIOR_WEIGHT / len(PRIOR.specs)
            weights = dict.fromkeys(PRIOR.specs, share)
        self.weights = weights
        self._target: TargetWorkload | None = None

    def add(self, request: Request | GpuRequest | Demand) -> None:
        """One more submission of `request`'s shape."""
        spec = spec_of(request)
        for known in list(self.weights):
            self.weights[known] *= DECAY
            if self.weights[known] < FORGET_BELOW:
                del self.weights[known]
        self.weights[spec] = self.weights.get(spec, 0.0) + 1.0
        while len(self.weights) > MAX_SHAPES:
            del self.weights[min(self.weights, key=self.weights.__getitem__)]
        self._target = None

    def target(self) -> TargetWorkload:
        """The target workload: each shape with its share of the total weight (cached until
        the next `add`)."""
        if self._target is None:
            ranked = sorted(self.weights.items(), key=lambda item: -item[1])
            total = sum(weight for _, weight in ranked)
            widest = max((spec.gpus for spec, _ in ranked), default=0)
            # a shape carries no host memory: the widest sizes are kept by CPU alone
            wide = [(spec.cpu, 0, w) for spec, w in ranked if spec.gpus == widest]
            self._target = TargetWorkload(
                tuple(spec for spec, _ in ranked),
                tuple(w / total for _, w in ranked),
                widest=Widest(
                    widest,
                    max((cpu for cpu, _, _ in wide), default=0),
                    sizes=wide_sizes(wide, total) if widest > 1 else (),
                ),
                gpu_milli_per_pod=(
                    sum(w * spec.gpus * spec.gpu_milli for spec, w in ranked) / total
                    if total
                    else 0.0
                ),
            )
        return self._target

    def describe(
        self, limit: int = 8, prices: SharePrices | None = None
    ) -> list[dict[str, object]]:
        """The heaviest shapes and their probability, for `describe` and the debug routes; a
        share's also with its price in `prices` ("gpu_value": what it is worth in GPUs where
        the mix packs best, scheduler/packing.py), those of the target placed by."""
        target = self.target()
        shapes = []
        for spec, p in list(zip(target.specs, target.probabilities, strict=True))[:limit]:
            shape = {
                **asdict(spec),
                "gpu_models": list(spec.gpu_models),
                "probability": round(p, 4),
            }
            if prices is not None and spec.is_share:
                shape["gpu_value"] = round(prices.price(spec.gpu_milli), 4)
            shapes.append(shape)
        return shapes

    def to_json(self) -> str:
        return json.dumps([{**_saved(spec), "weight": w} for spec, w in self.weights.items()])

    @classmethod
    def from_json(cls, text: str) -> RecentShapes:
        """The window saved by `to_json`; InvalidRequest for anything else."""
        try:
            rows = json.loads(text)
            weights = {}
            for row in rows[:MAX_SHAPES]:
                weight = float(row.pop("weight"))
                row["gpu_models"] = tuple(str(m) for m in row["gpu_models"])
                spec = PodSpec(**row)
                if not math.isfinite(weight) or weight <= 0:
                    raise ValueError(f"weight {weight!r}")
                _check(spec)
                weights[spec] = weight
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise InvalidRequest(f"invalid saved target workload: {err}") from err
        return cls(weights) if weights else cls()


def moved(old: TargetWorkload, new: TargetWorkload) -> bool:
    """Some shape's probability moved by more than TARGET_MOVED from `old` to `new` (a shape
    absent from one has probability 0 there), or the widest shape's GPU count changed (what
    `gpupool` keeps idle nodes for). The shapes' order, by weight, is no move: in a steady mix
    of many shapes the rare ones change places all the time, and taking each such target up
    would make the fragment index anew, and every shape's answers cold, for nothing."""
    if old.widest.gpus != new.widest.gpus:
        return True
    before = dict(zip(old.specs, old.probabilities, strict=True))
    after = dict(zip(new.specs, new.probabilities, strict=True))
    return any(
        abs(before.get(spec, 0.0) - after.get(spec, 0.0)) > TARGET_MOVED
        for spec in before.keys() | after.keys()
    )


def _check(spec: PodSpec) -> None:
    """ValueError unless every field of a saved spec has its type and range."""
    counts = (spec.cpu, spec.gpu_milli, spec.gpus, spec.memory)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in counts):
        raise ValueError(f"spec {spec}: counts must be non-negative integers")
    if spec.gpu_milli > MILLI_PER_GPU or spec.gpus > MAX_SAVED_GPUS:
        raise ValueError(f"spec {spec}: out of range")
    if not isinstance(spec.proportional, bool) or not isinstance(spec.memory_share, int | float):
        raise ValueError(f"spec {spec}: malformed memory")
    if not 0 <= spec.memory_share <= 1:
        raise ValueError(f"spec {spec}: memory share outside 0..1")
