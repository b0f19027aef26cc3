"""Parse and format the quantities humans type: `10Gi`, `4G`, `512MiB`, `50%`, `30`.

Sizes follow the Kubernetes quantity rules everywhere (CLI, YAML, the shim's GPUPOOL_* values),
since the Kubernetes side reads `10Gi` from pod specs: `G` is 10^9 and `Gi` is 2^30.
"""

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

#: Kubernetes quantity suffixes (case matters: `M` is mega, `m` milli), with the `B`/`iB` forms
#: people type for bytes (`4GiB` = `4Gi`, `4GB` = `4G`). Milli (`m`) is refused: bytes are whole.
_BYTE_SUFFIXES: dict[str, int] = {
    "": 1,
    "B": 1,
    **{f"{p}{b}": 1000 ** (i + 1) for i, p in enumerate("kMGTPE") for b in ("", "B")},
    **{f"{p}i{b}": 1024 ** (i + 1) for i, p in enumerate("KMGTPE") for b in ("", "B")},
}
#: a bare number below this is surely meant in another unit (`--memory 4096` is not 4 KB)
MIN_BARE_BYTES = MiB

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")


def _split(text: str, what: str) -> tuple[float, str]:
    match = _QUANTITY.match(text)
    if match is None:
        raise InvalidRequest(f"invalid {what} {text!r}")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise InvalidRequest(f"invalid {what} {text!r}: not a finite number")
    return value, match.group(2)


def _unit_hint(suffix: str) -> str:
    """What a suffix outside the Kubernetes grammar was probably meant to be."""
    if suffix == "m":
        return " (m is milli in Kubernetes quantities; use M for 10^6 or Mi for 2^20)"
    near = [known for known in _BYTE_SUFFIXES if known and known.lower() == suffix.lower()]
    if near:
        return f" (units are case-sensitive: did you mean {' or '.join(near)}?)"
    return " (use Ki, Mi, Gi, Ti for powers of 1024 or k, M, G, T for powers of 1000)"


def parse_bytes(text: str) -> int:
    """A size by Kubernetes quantity rules: `4Gi` = 4x2^30, `4G` = 4x10^9, `4GiB` = `4Gi`,
    `4GB` = `4G`, `4e9`; a bare number is bytes and must be at least 1 MiB."""
    value, suffix = _split(text, "memory size")
    factor = _BYTE_SUFFIXES.get(suffix)
    if factor is None:
        raise InvalidRequest(
            f"invalid memory size {text!r}: unknown unit {suffix!r}{_unit_hint(suffix)}"
        )
    size = round(value * factor)
    if not suffix and 0 < size < MIN_BARE_BYTES:
        raise InvalidRequest(
            f"invalid memory size {text!r}: {size} bytes is below 1Mi; did you mean {size}Mi?"
        )
    return size


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


def parse_compute_percent(value: str | float) -> int:
    """Per-GPU compute as a whole percent from 1 to 100 -> milli-GPU (30 -> 300): the one rule of
    the CLI (`30` or `30%`) and the API (the number 30).

    `1` is 1 %, never a whole GPU, and a fraction such as `0.5` is refused rather than guessed
    at: a share finer than a percent is below what the compute arbiter can hold.
    """
    percent: int | None = None
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]+)\s*(%?)\s*", value)
        percent = int(match.group(1)) if match is not None else None
    elif math.isfinite(value) and float(value).is_integer():
        percent = int(value)
    if percent is None or not 1 <= percent <= 100:
        raise InvalidRequest(
            f"invalid compute share {value!r}: use a whole percent from 1 to 100, such as 30 or 30%"
        )
    return percent * MILLI_PER_GPU // 100


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


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """`7d`, `12h`, `30m`, `45s`, `1.5h`, `0s` -> seconds (a unit is required: `30` could be
    seconds or minutes)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhdw])\s*", text)
    if match is None:
        raise InvalidRequest(
            f"invalid duration {text!r}: use a number and a unit, s, m, h, d or w (e.g. 7d, 12h)"
        )
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
