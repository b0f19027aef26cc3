"""Break each placement policy's documented rule once and check that a test fails.

Each mutant flips one rule in the engine (scheduler/), runs the policy tests, and puts the file
back. Prints which test caught each mutant; exits 1 if one was not caught. Run from the
checkout: `PYTHONPATH=src python tools/policy_mutants.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

R = str(Path(__file__).resolve().parents[1]) + "/"
T = [
    "tests/scheduler/test_policies.py",
    "tests/scheduler/test_engine_rules.py",
    "tests/scheduler/test_gpu_placement.py",
    "tests/scheduler/test_state.py",
    "tests/scheduler/test_spread.py",
    "tests/scheduler/test_gpupool_net.py",
    "tests/scheduler/test_packing.py",
]
MUTANTS = [
    (
        "gpupool-reserve",
        "src/gpupool/scheduler/gpupool_policy.py",
        "return wide.able[:, 0] if wide.counts[0] <= RESERVED_NODES else None",
        "return None",
    ),
    (
        "gpupool-sizes",
        "src/gpupool/scheduler/gpupool_policy.py",
        "and 0 < wide.counts[k] <= KEPT_PER_EXPECTED_POD * size.share * expected",
        "and 0 < wide.counts[k] <= KEPT_PER_EXPECTED_POD * size.share",
    ),
    (
        "gpupool-packing",
        "src/gpupool/scheduler/gpupool_policy.py",
        "charge = prices.lost(request.compute, PACKING_WEIGHT * MILLI_PER_GPU)",
        "charge = prices.lost(request.compute, 0.0)",
    ),
    (
        "packing-value",
        "src/gpupool/scheduler/packing.py",
        "loss = self.value[free] - self.value[free - milli] - self.price(milli)",
        "loss = self.value[free] - self.price(milli)",
    ),
    (
        "random",
        "src/gpupool/scheduler/paper.py",
        "node = int(feasible[self._rng.integers(feasible.size)])",
        "node = int(feasible[0])",
    ),
    (
        "dotprod",
        "src/gpupool/scheduler/paper.py",
        "return np.floor(MAX_SCORE * (1 - dot / 2)).astype(np.int64)",
        "return np.floor(MAX_SCORE * (1 + dot / 2)).astype(np.int64)",
    ),
    (
        "clustering",
        "src/gpupool/scheduler/paper.py",
        "np.where(has_own, np.where(classes == 1, 3, 2), np.where(classes == 0, 1, 0))",
        "np.where(has_own, np.where(classes == 1, 2, 3), np.where(classes == 0, 1, 0))",
    ),
    (
        "packing",
        "src/gpupool/scheduler/paper.py",
        "idle_score = np.maximum(MAX_SCORE // 3 - gpu_count, gpu_count)",
        "idle_score = np.maximum(MAX_SCORE // 2 - gpu_count, gpu_count)",
    ),
    (
        "bestfit",
        "src/gpupool/scheduler/paper.py",
        "raw = np.floor((1.0 - left) * MAX_SCORE).astype(np.int64)",
        "raw = np.floor((1.0 + left) * MAX_SCORE).astype(np.int64)",
    ),
    (
        "fgd",
        "src/gpupool/scheduler/fgd.py",
        "scores: IntArray = (100.0 / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)",
        "scores: IntArray = (100.0 / (1.0 + np.exp(delta / 1000.0))).astype(np.int64)",
    ),
    (
        "fgd-memory",
        "src/gpupool/scheduler/fragment.py",
        "        held &= self._memory_fits(kind, memory)\n",
        "\n",
    ),
    (
        "gpupool",
        "src/gpupool/scheduler/gpupool_policy.py",
        "scores: FloatArray = np.round(delta - STRANDING_WEIGHT * change, DECIMALS)",
        "scores: FloatArray = np.round(delta + STRANDING_WEIGHT * change, DECIMALS)",
    ),
    (
        "gpupool-one-node",
        "src/gpupool/scheduler/gpupool_policy.py",
        "return rounded(delta - STRANDING_WEIGHT * change)",
        "return rounded(delta + STRANDING_WEIGHT * change)",
    ),
    (
        "binpack",
        "src/gpupool/scheduler/share.py",
        "return usage if self.fullest_first else -usage",
        "return -usage if self.fullest_first else -usage",
    ),
    (
        "spread",
        "src/gpupool/scheduler/share.py",
        "return state.gpus_in_order(node, request, emptiest=not self.fullest_first)",
        "return state.gpus_in_order(node, request, emptiest=False)",
    ),
    (
        "gpu-memory",
        "src/gpupool/scheduler/state.py",
        "keys = (-compute, -memory) if emptiest else (compute, memory)",
        "keys = (-compute, memory) if emptiest else (compute, -memory)",
    ),
    (
        "spread-avoid",
        "src/gpupool/scheduler/gpu_placement.py",
        "others = [gpu for gpu in gpus if gpu.index not in avoid]",
        "others = list(gpus)",
    ),
    (
        "spread-fallback",
        "src/gpupool/scheduler/gpu_placement.py",
        "        if spread.fits:\n            return spread",
        "        return spread",
    ),
]


def main() -> int:
    ok = True
    for name, path, old, new in MUTANTS:
        ok &= _caught(name, R + path, old, new)
    print("all caught" if ok else "SOME NOT CAUGHT")
    return 0 if ok else 1


def _caught(name: str, path: str, old: str, new: str) -> bool:
    text = Path(path).read_text()
    assert text.count(old) == 1, (name, old)
    Path(path).write_text(text.replace(old, new))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *T],
            cwd=R,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": R + "src"},
        )
    finally:
        Path(path).write_text(text)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    caught = done.returncode != 0
    by = failed[0].split("::")[-1].split(" ")[0] if failed else "an error"
    print(f"{name:12} {'caught by ' + by if caught else 'NOT CAUGHT'}")
    return caught


if __name__ == "__main__":
    sys.exit(main())
