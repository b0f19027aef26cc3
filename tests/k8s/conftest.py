"""The kubelet side of the device-plugin tests: its socket directory and the test kubelet."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_support import TestKubelet, socket_dir


@pytest.fixture
def sockets() -> Iterator[Path]:
    """The kubelet's device-plugin directory."""
    directory = socket_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def kubelet(sockets: Path) -> Iterator[TestKubelet]:
    kubelet = TestKubelet(sockets).start()
    yield kubelet
    kubelet.stop()
