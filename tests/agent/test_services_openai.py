"""The OpenAI API at the router's root: requests routed by their body's `model` to real replicas
(an OpenAI-compatible server, examples/openai_server.py), the official `openai` client
(sync, async, streaming) and curl as the docs show them, and errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from tests.agent.daemon_support import EXAMPLES, cli, until
from tests.agent.services_support import Routed, routed_on

routed = routed_on()
REPLICA = str(EXAMPLES / "openai_server.py")


def serve(routed: Routed, name: str, *models: str, token_s: float = 0.0) -> None:
    argv = [sys.executable, REPLICA, name, str(token_s)]
    routed.create(name, argv=argv, models=list(models), compute=10, memory="1Gi")
    routed.ready(name)


def client(routed: Routed) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{routed.base}/v1", api_key="none", max_retries=0)


def test_requests_go_to_the_service_of_their_model_alias_included(routed: Routed) -> None:
    serve(routed, "chat", "llama-3-8b", "llama")
    serve(routed, "embed")  # its model is its name
    api = client(routed)
    for model in ("llama-3-8b", "llama"):
        answer = api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.model == model
        assert answer.system_fingerprint and answer.system_fingerprint.startswith("chat:")
        assert answer.choices[0].message.content == "hello from chat"
    completion = api.completions.create(model="llama", prompt="hi")
    assert completion.choices[0].text == "hello from chat"
    vectors = api.embeddings.create(model="embed", input=["a", "b"])
    assert [v.embedding[0] for v in vectors.data] == [0.0, 1.0]
    # the /NAME path goes on as before, beside the OpenAI API
    direct = httpx.post(f"{routed.base}/embed/v1/embeddings", json={"model": "x", "input": "a"})
    assert direct.status_code == 200 and direct.json()["model"] == "x"
    listed = api.models.list()
    assert sorted(m.id for m in listed.data) == ["embed", "llama", "llama-3-8b"]
    assert {m.owned_by for m in listed.data} == {"root"}
    assert all(m.object == "model" and m.created > 1e9 for m in listed.data)
    assert api.models.retrieve("llama").id == "llama"
    shown = routed.service("chat")
    assert shown["models"] == ["llama-3-8b", "llama"]


def test_the_async_client_and_a_stream_whose_first_chunk_is_not_held(routed: Routed) -> None:
    serve(routed, "gen", "gen-model", token_s=1.0)

    async def run() -> tuple[list[str], list[float], float]:
        api = openai.AsyncOpenAI(base_url=f"{routed.base}/v1", api_key="none", max_retries=0)
        async with api:
            began = time.monotonic()
            stream = await api.chat.completions.create(
                model="gen-model", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            words, times = [], []
            async for chunk in stream:
                words.append(chunk.choices[0].delta.content or "")
                times.append(time.monotonic() - began)
        return words, times, time.monotonic() - began

    words, times, total = asyncio.run(run())
    assert words == ["hello", "from", "gen"]
    # each chunk came as the replica wrote it: the first long before the last (2 s later)
    assert times[0] < total - 1.5, times


def test_a_stream_with_the_sync_client(routed: Routed) -> None:
    serve(routed, "gen", "gen-model")
    stream = client(routed).chat.completions.create(
        model="gen-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert [c.choices[0].delta.content for c in stream] == ["hello", "from", "gen"]


def test_curl_as_the_docs_show_it(routed: Routed) -> None:
    serve(routed, "chat", "llama")
    body = {"model": "llama", "messages": [{"role": "user", "content": "Hello"}]}
    shown = subprocess.run(
        [
            *("curl", "-sS", f"{routed.base}/v1/chat/completions"),
            *("-H", "Content-Type: application/json", "-d", json.dumps(body)),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(shown.stdout)["choices"][0]["message"]["content"] == "hello from chat"


def error_of(answer: httpx.Response) -> dict[str, Any]:
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


def test_errors_come_in_openais_shape(routed: Routed) -> None:
    serve(routed, "chat", "llama")
    url = f"{routed.base}/v1/chat/completions"
    unknown = httpx.post(url, json={"model": "gpt-9", "messages": []})
    assert unknown.status_code == 404
    assert error_of(unknown)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as raised:
        client(routed).embeddings.create(model="nope", input="a")
    assert raised.value.code == "model_not_found"
    for bad in (b"not json", b"[1, 2]", b'{"messages": []}', b'{"model": 7}'):
        answer = httpx.post(url, content=bad, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400, bad
        assert error_of(answer)["type"] == "invalid_request_error"
    large = {"model": "llama", "prompt": "x" * (300 * 1024)}
    too_large = httpx.post(f"{routed.base}/v1/completions", json=large)
    assert too_large.status_code == 413 and error_of(too_large)["code"] == "request_too_large"
    other = httpx.get(f"{routed.base}/v1/files")
    assert other.status_code == 404 and error_of(other)["code"] == "unknown_url"
    missing = httpx.get(f"{routed.base}/v1/models/gpt-9")
    assert missing.status_code == 404 and error_of(missing)["code"] == "model_not_found"


def test_a_model_name_is_one_services_and_names_are_checked(routed: Routed) -> None:
    serve(routed, "chat", "llama")
    url = routed.daemon.url
    taken = cli("service", "create", "other", "--model", "llama", "--", "true", url=url)
    assert taken.returncode != 0
    assert taken.stderr.count("\n") == 1 and "already served by service chat" in taken.stderr
    named = cli("service", "create", "llama", "--", "true", url=url)  # its default model
    assert named.returncode != 0 and "already served by service chat" in named.stderr
    for bad in ("has space", "", "x" * 129, "tab\there"):
        refused = cli("service", "create", "other", "--model", bad, "--", "true", url=url)
        assert refused.returncode != 0 and "invalid --model" in refused.stderr, bad
    v1 = cli("service", "create", "v1", "--", "true", url=url)
    assert v1.returncode != 0 and "OpenAI API" in v1.stderr
    assert [s["name"] for s in routed.daemon.call("GET", "/v1/services")["services"]] == ["chat"]
    models = httpx.get(f"{routed.base}/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["llama"]
    # update: another service's name refused, nothing changed; a free one replaces them
    routed.create("other", argv=["/bin/true"], min_replicas=0, models=["other-model"])
    clash = cli("service", "update", "other", "--model", "llama", url=url)
    assert clash.returncode != 0 and "already served by service chat" in clash.stderr
    assert routed.service("other")["models"] == ["other-model"]
    assert cli("service", "update", "other", "--model", "fresh", url=url).returncode == 0
    shown = cli("service", "ls", url=url).stdout
    assert "fresh" in shown and "llama" in shown, shown

    def listed() -> list[str]:
        return sorted(m["id"] for m in httpx.get(f"{routed.base}/v1/models").json()["data"])

    assert until(lambda: listed() == ["fresh", "llama"]), listed()


#: a replica that passes its health check and closes each other request's connection unanswered
DROPS = """
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_POST(self):
        self.close_connection = True
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def test_a_failed_replica_and_a_deleted_service_answer_in_openais_shape(routed: Routed) -> None:
    routed.create("drops", argv=[sys.executable, "-c", DROPS], models=["drops-model"])
    routed.ready("drops")
    url = f"{routed.base}/v1/chat/completions"
    failed = httpx.post(url, json={"model": "drops-model", "messages": []}, timeout=30)
    assert failed.status_code == 502 and error_of(failed)["type"] == "server_error"
    # a request waiting for a replica that never comes, its service deleted meanwhile
    never = [sys.executable, "-c", "import time; time.sleep(600)"]
    routed.create("never", argv=never, models=["never-model"])
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            httpx.post(url, json={"model": "never-model", "messages": []}, timeout=60)
        )
    )
    waiting.start()
    assert until(lambda: routed.service("never")["queued"] == 1, timeout=20)
    routed.daemon.call("DELETE", "/v1/services/never", json={})
    waiting.join(30)
    assert answers and answers[0].status_code == 404
    assert "was deleted" in error_of(answers[0])["message"]
