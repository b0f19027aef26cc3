"""docs/cli.md is what tools/cli_reference.py renders from the commands' own `--help` today."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "tools" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered(reference: ModuleType) -> str:
    return str(reference.render())


def test_the_committed_reference_is_current(rendered: str) -> None:
    assert DOC.read_text() == rendered, "docs/cli.md is out of date: run make cli-docs"


def test_every_command_the_root_help_lists_has_its_section(rendered: str) -> None:
    root_help = rendered.split("\n## gpupool\n", 1)[1].split("\n### ", 1)[0]
    panel = root_help.split("Commands", 1)[1]
    names = re.findall(r"^  ([a-z][a-z0-9-]*) ", panel, flags=re.MULTILINE)
    assert {"exec", "serve", "submit", "gpus", "mig", "k8s"} <= set(names)
    for name in names:
        assert f"\n### gpupool {name}\n" in rendered, name


def test_subcommands_of_a_group_are_rendered(rendered: str) -> None:
    assert "\n#### gpupool mig apply\n" in rendered
    assert "Usage: gpupool mig apply" in rendered


def test_the_help_is_rendered_without_colour_at_100_columns(rendered: str) -> None:
    assert "\x1b[" not in rendered
    assert max(len(line) for line in rendered.splitlines()) <= 100
