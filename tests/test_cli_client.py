"""The daemon's client: no daemon is one line, and one client outlives a daemon's restart."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from tests.app_thread import serving

from gpupool.agent.access import Access
from gpupool.agent.agent import Agent
from gpupool.api.app import create_app
from gpupool.api.client import Client
from gpupool.core.errors import DaemonError, InvalidRequest


def test_one_client_answers_again_after_the_daemon_restarts(tmp_path: Path) -> None:
    path = tmp_path / "gpupool.sock"
    # /v1/health asks the agent nothing; the app reads the daemon's access rules at its creation
    agent = SimpleNamespace(view=SimpleNamespace(access=Access(os.geteuid())))
    app = create_app(cast(Agent, agent))
    with Client(f"unix://{path}") as client:
        with pytest.raises(DaemonError, match="no gpupool daemon at unix://"):
            client.call("GET", "/v1/health")
        with serving(app, path):
            assert client.call("GET", "/v1/health")["ok"] is True
        with pytest.raises(DaemonError):
            client.call("GET", "/v1/health")
        with serving(app, path):
            assert client.call("GET", "/v1/health")["ok"] is True


@pytest.mark.parametrize("url", ["ftp://host", "http://", "localhost:8470"])
def test_a_bad_url_is_one_line(url: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid daemon URL"):
        Client(url)
