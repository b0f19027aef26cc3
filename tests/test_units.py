"""core.units: the quantities humans type."""

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import (
    GiB,
    MiB,
    format_bytes,
    parse_bytes,
    parse_compute_percent,
    parse_fraction,
    parse_int_range,
    parse_memory_share,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10GiB", 10 * GiB),
        ("512MiB", 512 * MiB),
        ("512Mi", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("10GB", 10 * 10**9),
        ("4G", 4 * 10**9),
        ("4Gi", 4 * GiB),
        ("4e9", 4 * 10**9),
        ("512k", 512_000),
        ("1Ti", 1024 * GiB),
        ("2T", 2 * 10**12),
        ("1048576", MiB),
        (" 2 GiB ", 2 * GiB),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text", ["", "GiB", "-1GiB", "10XB", "nan", "1e999GiB", "ten", "4g", "4m", "512mi", "1K"]
)
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(InvalidRequest, match="memory size"):
        parse_bytes(text)


@pytest.mark.parametrize(("text", "hint"), [("4096", "did you mean 4096Mi?"), ("4g", "G?")])
def test_parse_bytes_says_what_was_meant(text: str, hint: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(hint)):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert format_bytes(10 * GiB) == "10GiB"
    assert format_bytes(512 * MiB) == "512MiB"
    assert format_bytes(3 * GiB // 2) == "1.5GiB"
    assert format_bytes(12) == "12B"


@given(st.integers(min_value=1, max_value=1 << 50))
def test_format_then_parse_is_close(n: int) -> None:
    back = parse_bytes(format_bytes(n))
    assert math.isclose(back, n, rel_tol=0.05)


@pytest.mark.parametrize(("text", "expected"), [("50%", 0.5), ("0.5", 0.5), ("100%", 1.0)])
def test_parse_fraction(text: str, expected: float) -> None:
    assert parse_fraction(text) == expected


@pytest.mark.parametrize("text", ["150%", "0", "0%", "-5%", "1.5", "nan%", "50MiB"])
def test_parse_fraction_rejects_naming_the_value(text: str) -> None:
    with pytest.raises(InvalidRequest, match=text.replace("%", "%").replace(".", r"\.")):
        parse_fraction(text)


@pytest.mark.parametrize(
    ("text", "milli"),
    [("30", 300), ("30%", 300), ("1", 10), ("1%", 10), ("100", 1000), (" 7 ", 70), (30.0, 300)],
)
def test_parse_compute(text: str | float, milli: int) -> None:
    assert parse_compute_percent(text) == milli


@pytest.mark.parametrize(
    "text",
    ["150", "150%", "0", "101", "0.5", "1.0", "99.9", "-3", "abc", "nan", "30GiB", 0.5, 0.0, 101.0],
)
def test_parse_compute_rejects(text: str | float) -> None:
    with pytest.raises(InvalidRequest):
        parse_compute_percent(text)


def test_memory_share_absolute_and_relative() -> None:
    assert parse_memory_share("4GiB").resolve(80 * GiB) == 4 * GiB
    assert parse_memory_share("50%").resolve(80 * GiB) == 40 * GiB
    assert str(parse_memory_share("50%")) == "50%"
    with pytest.raises(InvalidRequest):
        parse_memory_share("0GiB")


def test_int_range() -> None:
    assert parse_int_range("42-51") == list(range(42, 52))
    assert parse_int_range("1,3,5-6,3") == [1, 3, 5, 6]
    for bad in ("51-42", "a-b", "", "1-"):
        with pytest.raises(InvalidRequest):
            parse_int_range(bad, "seed range")
