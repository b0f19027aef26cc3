"""The error tree is one set of facts: its docstring is its classes, and each class raised in the
daemon reaches the CLI as itself (class, exit code, message) through the real API and client."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from tests.app_thread import serving

from gpupool.agent.access import Access
from gpupool.agent.agent import Agent
from gpupool.api.app import create_app
from gpupool.api.client import Client
from gpupool.cli.main import main
from gpupool.core import errors
from gpupool.core.errors import DaemonError, GpupoolError

#: `│   ├── Name   exit  HTTP  meaning`: the tree's prefix, the class, its two numbers
_LINE = re.compile(r"^    ((?:[│ ]   )*(?:[├└]── )?)(\w+)\s+(\d+)\s+(\d+)\s+\S")
TREE = [
    kind
    for kind in errors.classes()
    if kind.__module__ == errors.__name__  # classes of other modules join the tree elsewhere
]
#: every class a daemon route may raise (the base is never raised itself)
RAISED = [kind for kind in TREE if kind is not GpupoolError]


def _documented() -> dict[str, tuple[str | None, int, int]]:
    """name -> (parent's name, exit code, HTTP status), as the module docstring draws them."""
    assert errors.__doc__ is not None
    found: dict[str, tuple[str | None, int, int]] = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        prefix, name, code, status = match.groups()
        depth = len(prefix) // 4
        parents[depth:] = [name]
        found[name] = (parents[depth - 1] if depth else None, int(code), int(status))
    return found


def test_the_docstring_draws_the_class_tree_exactly() -> None:
    real = {
        kind.__name__: (
            kind.__bases__[0].__name__ if kind is not GpupoolError else None,
            kind.exit_code,
            kind.http_status,
        )
        for kind in TREE
    }
    assert _documented() == real


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, errors.InvalidRequest),
        (401, errors.Unauthorized),
        (403, errors.PermissionDenied),
        (404, errors.NotFound),
        (409, errors.Unschedulable),
        (502, errors.KubeApiError),
        (503, DaemonError),  # DeviceError answers 503 too: no one class owns it
        (500, DaemonError),
        (418, DaemonError),
    ],
)
def test_an_unknown_name_maps_by_the_status_one_class_brings_in(
    status: int, kind: type[GpupoolError]
) -> None:
    err = errors.from_answer("SomethingNewer", status, "it broke")
    assert type(err) is kind and str(err) == "it broke"


class _Raising:
    """The agent's one method that GET /v1/jobs/{id} calls first: it raises RAISED[id]."""

    #: the app reads the daemon's access rules at its creation
    config = SimpleNamespace(access=Access(os.geteuid()))

    def job(self, job_id: int) -> Any:
        kind = RAISED[job_id]
        raise kind(f"{kind.__name__}: what went wrong, and what to do")


@pytest.fixture(scope="module")
def daemon_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real app on a real Unix socket, its agent raising."""
    path = Path(tmp_path_factory.mktemp("daemon")) / "gpupool.sock"
    with serving(create_app(cast(Agent, _Raising())), path) as url:
        yield url


@pytest.mark.parametrize("index", range(len(RAISED)), ids=[k.__name__ for k in RAISED])
def test_a_daemon_side_error_reaches_the_cli_as_itself(
    index: int, daemon_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kind = RAISED[index]
    message = f"{kind.__name__}: what went wrong, and what to do"
    transport = httpx.HTTPTransport(uds=daemon_url.removeprefix("unix://"))
    with httpx.Client(transport=transport, base_url="http://gpupool") as raw:
        answer = raw.get(f"/v1/jobs/{index}")
    assert answer.status_code == kind.http_status
    assert answer.json() == {"error": kind.__name__, "message": message}
    with Client(daemon_url) as client, pytest.raises(GpupoolError) as caught:
        client.call("GET", f"/v1/jobs/{index}")
    assert type(caught.value) is kind and str(caught.value) == message
    with pytest.raises(SystemExit) as exited:
        main(["describe", str(index), "--url", daemon_url])
    assert exited.value.code == kind.exit_code
    assert capsys.readouterr().err == f"gpupool: error: {message}\n"
