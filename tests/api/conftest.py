"""A fresh daemon per test on a simulated 2x A100-40GB node (as tests/agent's fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import Daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "2xA100-40GB")
