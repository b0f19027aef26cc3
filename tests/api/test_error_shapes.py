"""Every error the API answers, in the documented shape (issue 35, item 8 and the smaller ones):
an id, offset or replica out of range is a 4xx, never a 500 with a traceback in the log; an
unknown path, a wrong method, a body that is not UTF-8 or is deeply nested JSON answer
`{"error": CLASS, "message": ONE LINE}` (docs/protocols/daemon-api.md), not FastAPI's
`{"detail": ...}`. Over the daemon's real socket."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import CUDA_JOB, Daemon

BIG = 2**63
#: every route with an integer in its path, as (method, path, JSON body or None)
JOB_ROUTES = [
    ("GET", "/v1/jobs/{id}", None),
    ("POST", "/v1/jobs/{id}/cancel", {}),
    ("GET", "/v1/jobs/{id}/logs", None),
    ("POST", "/v1/jobs/{id}/suspend", {}),
    ("POST", "/v1/jobs/{id}/resume", {}),
    ("POST", "/v1/jobs/{id}/resize", {"memory": "1Gi"}),
    ("GET", "/jobs/{id}", None),
]


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module: nothing here changes what it holds."""
    yield from serving(tmp_path_factory.mktemp("edges"), "1xA30")


@pytest.fixture
def http(edges: Daemon) -> Iterator[httpx.Client]:
    transport = httpx.HTTPTransport(uds=str(edges.state_dir / "gpupool.sock"))
    with httpx.Client(transport=transport, base_url="http://localhost") as client:
        yield client


def _refused(response: httpx.Response, status: int) -> dict[str, Any]:
    """The documented error body of `response`, checked to be a `status`."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "message"}, body
    assert isinstance(body["message"], str) and "\n" not in body["message"]
    return body


def _no_traceback(daemon: Daemon) -> None:
    log = (daemon.root / "serve.log").read_text()
    assert "Traceback" not in log and " 500 " not in log, log[-3000:]


@pytest.mark.parametrize(("method", "path", "body"), JOB_ROUTES)
def test_a_job_id_out_of_range_is_a_404_in_the_documented_shape(
    edges: Daemon, http: httpx.Client, method: str, path: str, body: dict[str, Any] | None
) -> None:
    for job_id in (BIG, 2**64, -BIG - 1, -(2**64), 0, 10**40):
        response = http.request(method, path.format(id=job_id), json=body)
        refused = _refused(response, 404)
        assert refused == {"error": "NotFound", "message": f"no job {job_id}"}
    _no_traceback(edges)


def test_a_log_offset_out_of_range_is_a_400(daemon: Daemon) -> None:
    job_id = daemon.submit(["python3", CUDA_JOB, "0.1"], memory="1Gi", compute=10)
    daemon.wait(job_id)
    daemon.call("POST", "/v1/services", json=_service())
    transport = httpx.HTTPTransport(uds=str(daemon.state_dir / "gpupool.sock"))
    with httpx.Client(transport=transport, base_url="http://localhost") as http:
        for offset in (BIG, 2**64, 10**30):
            for path in (f"/v1/jobs/{job_id}/logs", "/v1/services/edge/logs"):
                refused = _refused(http.get(path, params={"offset": offset}), 400)
                assert refused["error"] == "InvalidRequest", refused
                assert "offset" in refused["message"], refused
            # any replica number is only one the service does not have
            answer = http.get("/v1/services/edge/logs", params={"replica": offset})
            has_not = f"service edge has no replica {offset} "
            assert _refused(answer, 404)["message"].startswith(has_not)
        # a negative offset reads from the top, as before
        assert http.get(f"/v1/jobs/{job_id}/logs", params={"offset": -BIG}).status_code == 200
    _no_traceback(daemon)


def _service() -> dict[str, Any]:
    argv = ["python3", "-m", "http.server"]
    return {"name": "edge", "argv": argv, "memory": "1Gi", "compute": 10, "min_replicas": 0}


def test_unknown_paths_wrong_methods_and_bad_bodies_answer_the_documented_shape(
    edges: Daemon, http: httpx.Client
) -> None:
    assert _refused(http.get("/v1/nothing-here"), 404) == {
        "error": "NotFound",
        "message": "no such path /v1/nothing-here (the API's routes are at /docs)",
    }
    wrong = _refused(http.get("/v1/drain"), 405)
    assert wrong == {
        "error": "InvalidRequest",
        "message": "GET is not allowed on /v1/drain (allowed: POST)",
    }
    headers = {"Content-Type": "application/json"}
    not_utf8 = http.post("/v1/jobs", content=b'{"argv": ["\xff\xfe"]}', headers=headers)
    assert _refused(not_utf8, 400) == {
        "error": "InvalidRequest",
        "message": "the request body is not JSON this daemon can read: not UTF-8 text (byte 11)",
    }
    deep = b'{"argv": ["true"], "env": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    nested = _refused(http.post("/v1/jobs", content=deep, headers=headers), 400)
    assert nested["message"].endswith("it nests too deep"), nested
    for bad in (b"{", b"nul", b'{"argv": ["true"]} trailing'):
        assert _refused(http.post("/v1/jobs", content=bad, headers=headers), 400)
    assert edges.call("GET", "/v1/jobs", params={"all": True})["jobs"] == []
    _no_traceback(edges)


def test_the_events_bounds_are_refused_in_the_documented_shape(
    edges: Daemon, http: httpx.Client
) -> None:
    for params in ({"limit": BIG}, {"limit": 2**64}, {"limit": 0}, {"since": "x"}):
        assert _refused(http.get("/v1/events", params=params), 400)["error"] == "InvalidRequest"
    for since in ("nan", "inf", "-inf", "1e999", str(2**64)):
        answer = http.get("/v1/events", params={"since": since})
        assert answer.status_code in (200, 400), (since, answer.text)
        if answer.status_code == 400:
            _refused(answer, 400)
    _no_traceback(edges)
