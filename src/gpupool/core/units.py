"""Parse and format the quantities humans type: `10GiB`, `512MiB`, `50%`, `0.5`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpupool.core.errors import InvalidRequest

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

#: milli-GPU in one whole GPU (the trace's gpu_milli unit)
MILLI_PER_GPU = 1000

_BYTE_SUFFIXES: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": KiB,
    "kib": KiB,
    "mi": MiB,
    "mib": MiB,
    "gi": GiB,
    "gib": GiB,
    "ti": TiB,
    "tib": TiB,
}

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")


def _split(text: str, what: str) -> tuple[float, str]:
    match = _QUANTITY.match(text)
    if match is None:
        raise InvalidRequest(f"invalid {what} {text!r}")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise InvalidRequest(f"invalid {what} {text!r}: not a finite number")
    return value, match.group(2)


def parse_bytes(text: str) -> int:
    """`10GiB` -> 10737418240; decimal (`10GB`) and binary (`10GiB`) suffixes; bare = bytes."""
    value, suffix = _split(text, "memory size")
    factor = _BYTE_SUFFIXES.get(suffix.lower())
    if factor is None:
        raise InvalidRequest(
            f"invalid memory size {text!r}: unknown unit {suffix!r} (use B, KiB, MiB, GiB, TiB)"
        )
    return round(value * factor)


def format_bytes(n: int) -> str:
    """Binary units with at most one decimal, exact when whole: 10737418240 -> `10GiB`."""
    if n < 0:
        return "-" + format_bytes(-n)
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= factor:
            scaled = n / factor
            if scaled == int(scaled):
                return f"{int(scaled)}{unit}"
            return f"{scaled:.1f}{unit}"
    return f"{n}B"


def parse_fraction(text: str) -> float:
    """`50%` or `0.5` -> 0.5; must lie in (0, 1]."""
    value, suffix = _split(text, "fraction")
    if suffix == "%":
        value /= 100.0
    elif suffix:
        raise InvalidRequest(f"invalid fraction {text!r}: use a percentage (50%) or 0..1 (0.5)")
    if not 0.0 < value <= 1.0:
        raise InvalidRequest(f"invalid fraction {text!r}: must be above 0 and at most 100%")
    return value


def parse_compute_milli(text: str) -> int:
    """Per-GPU compute: `30` or `30%` (percent of a GPU), or `0.3` -> 300 milli-GPU."""
    value, suffix = _split(text, "compute share")
    if suffix == "%" or (not suffix and value > 1.0):
        percent = value
    elif not suffix:
        percent = value * 100.0
    else:
        raise InvalidRequest(f"invalid compute share {text!r}: use a percentage such as 30")
    if not 0.0 < percent <= 100.0:
        raise InvalidRequest(f"invalid compute share {text!r}: must be above 0 and at most 100%")
    return round(percent * MILLI_PER_GPU / 100.0)


@dataclass(frozen=True)
class MemoryShare:
    """Per-GPU memory as typed: absolute bytes, or a fraction of the GPU's memory."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, gpu_total: int) -> int:
        """Bytes on a GPU with `gpu_total` bytes."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return int(gpu_total * self.fraction)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        assert self.fraction is not None
        return f"{self.fraction * 100:g}%"


def parse_memory_share(text: str) -> MemoryShare:
    """`4GiB` -> bytes; `50%` -> half of the GPU."""
    if text.strip().endswith("%"):
        return MemoryShare(fraction=parse_fraction(text))
    size = parse_bytes(text)
    if size <= 0:
        raise InvalidRequest(f"invalid memory size {text!r}: must be positive")
    return MemoryShare(bytes=size)


def parse_int_range(text: str, what: str = "range") -> list[int]:
    """`42-51` -> [42..51]; `1,3,5-6` -> [1, 3, 5, 6]; order kept, duplicates dropped."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(-?\d+)(?:\s*-\s*(-?\d+))?", part)
        if match is None:
            raise InvalidRequest(f"invalid {what} {text!r}: use N, N-M or a comma list")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise InvalidRequest(f"invalid {what} {text!r}: {high} is below {low}")
        if high - low > 100_000:
            raise InvalidRequest(f"invalid {what} {text!r}: too many values")
        values.extend(v for v in range(low, high + 1) if v not in values)
    return values
