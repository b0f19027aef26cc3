"""MPS mode's target on the simulated driver: bench/gpu/modes.py's steps on a simulated node.

Two jobs through a real `gpupool serve --simulate` in `--mode mps`, 30 % and 70 % of the SMs,
each alone and then together; the control daemon is gpupool's twin, the kernels run on the
simulated driver, which gives an MPS client its percentage of the SMs and runs clients of one
server at once. Target (issue 10): each of the pair within 5 points of the same percentage alone.
Then the priority pair: a `high` 50 % request loop alone, beside a busy `low` 50 % job of two
long-kernel clients, and beside the same job at `high`; the low job's share of its rate alone.

    make -C native && PYTHONPATH=src python bench/modes.py --out docs/benchmarks/modes-sim.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

GPU_CHECK = Path(__file__).resolve().parent / "gpu" / "modes.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--spec", default="1xH100-80GB", help="the simulated node")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each job measures")
    args = parser.parse_args()
    command = [sys.executable, str(GPU_CHECK), "--simulate", args.spec]
    command += ["--seconds", str(args.seconds), "--out", str(args.out)]
    sys.exit(subprocess.run(command, check=False).returncode)


if __name__ == "__main__":
    main()
