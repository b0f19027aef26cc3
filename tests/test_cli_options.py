"""One declaration per shared option, and one rule for a compute percent in the CLI and the API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupool.api.app import SubmitBody, _spec
from gpupool.cli import options
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import parse_compute_percent

CLI = Path(options.__file__).parent
SHARED = ("--simulate", "--node-dir", "--memory", "--compute", "--priority", "--url", "--json")


@pytest.mark.parametrize("flag", SHARED)
def test_a_shared_option_is_declared_in_options_only(flag: str) -> None:
    declaring = [
        path.name
        for path in sorted(CLI.glob("*.py"))
        if re.search(rf'"{flag}"', path.read_text()) and path != Path(options.__file__)
    ]
    assert declaring == []


@pytest.mark.parametrize("value", ["0.5", "101", "0", "abc"])
def test_the_api_refuses_what_the_cli_refuses(value: str) -> None:
    with pytest.raises(InvalidRequest) as cli:
        parse_compute_percent(value)
    number = float(value) if value.replace(".", "").isdigit() else float("nan")
    with pytest.raises(InvalidRequest) as api:
        _spec(SubmitBody(argv=["true"], compute=number))
    assert "whole percent from 1 to 100" in str(cli.value) and str(api.value).endswith(
        "use a whole percent from 1 to 100, such as 30 or 30%"
    )


def test_the_api_takes_what_the_cli_takes() -> None:
    assert _spec(SubmitBody(argv=["true"], compute=30)).compute == parse_compute_percent("30")
