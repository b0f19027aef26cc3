"""Fixtures shared by the native tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from shim_support import PROGS, compile_prog

from gpupool.isolation.libraries import native_libraries


@pytest.fixture(scope="session")
def request_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/native/progs/request_loop.c built against the simulated driver."""
    out = tmp_path_factory.mktemp("progs") / "request_loop"
    return compile_prog(
        PROGS / "request_loop.c", out, f"-L{native_libraries().sim_dir}", "-l:libcuda.so.1"
    )
