"""The isolation tests run the NVML backend on the devices tests' scenario fake of pynvml."""

from __future__ import annotations

import sys
from pathlib import Path

# nvml_fake lives with the devices tests; one fake of pynvml for the whole suite
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devices"))
