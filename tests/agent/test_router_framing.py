"""The router against clients that trickle, smuggle or crowd: a request takes a replica slot only
once its head and body are in, what goes to a replica is framed one way only, and an upstream
connection is reused only after a cleanly framed exchange (real daemon, router and replicas,
among them Python's own http.server, HTTP/1.0 and HTTP/1.1)."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.agent.daemon_support import until
from tests.agent.router_attacks import json_body, raw, status_of, trickle
from tests.agent.services_support import Routed, routed_on

from gpupool.api.router_limits import BODY_S, HEAD_S, MAX_PER_PEER, SEND_S

routed = routed_on()
PLAIN = str(Path(__file__).with_name("plain_replica.py"))
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


def plain(routed: Routed, name: str, protocol: str) -> None:
    argv = [sys.executable, PLAIN, protocol]
    routed.create(name, argv=argv, health="/health", min_replicas=1, max_replicas=1)
    routed.ready(name)


def test_clients_trickling_their_bodies_hold_no_replica_slot(routed: Routed) -> None:
    routed.create("victim", concurrency=1, min_replicas=1, max_replicas=1)
    routed.ready("victim")
    head = b"POST /victim/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    chunked = b"POST /victim/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    held = [trickle(routed.port, head) for _ in range(6)]
    held += [trickle(routed.port, chunked + b"3e8\r\n") for _ in range(2)]
    try:
        time.sleep(0.5)
        assert routed.service("victim")["in_flight"] == 0
        began = time.monotonic()
        answer = httpx.get(f"{routed.base}/victim/infer", timeout=20)
        assert answer.status_code == 200 and time.monotonic() - began < 5
    finally:
        for sock in held:
            sock.close()


def test_framing_a_replica_could_read_otherwise_is_refused(routed: Routed) -> None:
    plain(routed, "plain", "HTTP/1.1")
    post = b"POST /plain/x HTTP/1.1\r\nHost: x\r\n"
    cases = [
        post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        post + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        post + b"Content-Length: 5, 5\r\n\r\nhello",
        post + b"Content-Length: +5\r\n\r\nhello",
        post + b"Transfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        post + b"Transfer-Encoding: gzip\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\n1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\n0\r\n" + SMUGGLED,
        b"POST /plain/x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        post + b"X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        post + b"X-A: 1\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        post + b"X-A: 1\rContent-Length: 3\r\n\r\nabc",
        post + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        b"GET /plain/x HTTP/1.1\r\nHost: x\r\nContent-Length: "
        + str(len(SMUGGLED)).encode()
        + b"\r\n\r\n"
        + SMUGGLED,
        b"GET /plain/x HTTP/1.1 x\r\nHost: x\r\n\r\n",
        b"GET /plain/x HTTP/2.0\r\nHost: x\r\n\r\n",
    ]
    for case in cases:
        answer = raw(routed.port, case)
        assert status_of(answer) == 400, (case, answer)
        assert json_body(answer)["error"] == "BadRequest", answer
    many = b"GET /plain/x HTTP/1.1\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n"
    huge = b"GET /plain/x HTTP/1.1\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n"
    for case in (many, huge):
        assert status_of(raw(routed.port, case)) == 431
    chunk = b"10000\r\n" + b"a" * 65536 + b"\r\n"
    large = post + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 5 + b"0\r\n\r\n"
    assert status_of(raw(routed.port, large)) == 413
    assert routed.service("plain")["statuses"] == {}  # none of them reached the replica
    assert httpx.get(f"{routed.base}/plain/fine").json()["path"] == "/fine"


def smuggling(name: bytes) -> list[bytes]:
    """Three ways to hide a request in another's body, for a replica that reads only
    Content-Length (as http.server does)."""
    post = b"POST /" + name + b"/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    in_data = post + f"{len(SMUGGLED):x}\r\n".encode() + SMUGGLED + b"\r\n0\r\n\r\n"
    in_trailer = post + b"0\r\n" + SMUGGLED
    length = str(len(SMUGGLED)).encode()
    in_get = b"GET /" + name + b"/a HTTP/1.1\r\nHost: x\r\nContent-Length: " + length
    return [in_data, in_trailer, in_get + b"\r\n\r\n" + SMUGGLED]


@pytest.mark.parametrize("protocol", ["HTTP/1.0", "HTTP/1.1"])
def test_a_smuggled_request_never_answers_the_next_client(routed: Routed, protocol: str) -> None:
    plain(routed, "plain", protocol)
    with httpx.Client(timeout=10) as victim:
        for round_ in range(10):
            for number, attack in enumerate(smuggling(b"plain")):
                sent = raw(routed.port, attack)
                answer = victim.get(f"{routed.base}/plain/ok{round_}-{number}")
                assert answer.status_code == 200, answer.text
                assert answer.json()["path"] == f"/ok{round_}-{number}", answer.text
                # the chunked one goes through, its body read as a body; the others are refused
                assert status_of(sent) == (200 if number == 0 else 400), sent
                if number == 0:
                    assert json_body(sent)["body"] == SMUGGLED.decode()
    assert set(routed.service("plain")["statuses"]) == {"200"}


def answers(data: bytes) -> list[dict[str, Any]]:
    """The JSON bodies of the answers one after the other in `data`, by their Content-Length."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        framed = re.search(rb"Content-Length: ([0-9]+)", head, re.IGNORECASE)
        assert framed is not None, head
        length = int(framed.group(1))
        found.append(json.loads(rest[:length]))
        data = rest[length:]
    return found


def test_pipelined_requests_are_each_framed_and_answered_in_order(routed: Routed) -> None:
    plain(routed, "plain", "HTTP/1.0")
    large = b"z" * 300_000  # over the buffer: streamed after its start
    pipelined = [
        b"GET /plain/a HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /plain/b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /plain/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-T: 1\r\n\r\n",
        b"POST /plain/d HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n" + large,
        b"GET /plain/e HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ]
    found = answers(raw(routed.port, b"".join(pipelined), timeout=30))
    assert [(a["path"], a["body"]) for a in found] == [
        ("/a", ""),
        ("/b", "hello"),
        ("/c", "abcde"),
        ("/d", large.decode()),
        ("/e", ""),
    ]


def test_one_peer_cannot_hold_every_connection(routed: Routed) -> None:
    plain(routed, "plain", "HTTP/1.1")
    idle = [socket.create_connection(("127.0.0.1", routed.port)) for _ in range(MAX_PER_PEER)]
    try:
        time.sleep(0.5)
        # refused as it is accepted, before anything is read: the answer comes unasked
        with socket.create_connection(("127.0.0.1", routed.port), timeout=10) as extra:
            crowded = extra.recv(65536)
        assert status_of(crowded) == 503, crowded
        assert f"{MAX_PER_PEER} connections from 127.0.0.1" in json_body(crowded)["message"]
    finally:
        for sock in idle:
            sock.close()
    assert until(lambda: httpx.get(f"{routed.base}/plain/x").status_code == 200, timeout=10)


def test_a_client_that_stops_reading_its_answer_frees_the_replica(routed: Routed) -> None:
    plain(routed, "plain", "HTTP/1.1")
    with socket.create_connection(("127.0.0.1", routed.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /plain/big HTTP/1.1\r\nHost: x\r\n\r\n")  # and reads nothing
        assert until(lambda: routed.service("plain")["in_flight"] == 1, timeout=10)
        freed = until(lambda: routed.service("plain")["in_flight"] == 0, timeout=SEND_S + 15)
        assert freed, routed.service("plain")


def test_slow_heads_idle_connections_and_slow_bodies_are_cut(routed: Routed) -> None:
    plain(routed, "plain", "HTTP/1.1")
    began = time.monotonic()
    slow_head = socket.create_connection(("127.0.0.1", routed.port))
    slow_head.sendall(b"GET /plain/x HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    idle = socket.create_connection(("127.0.0.1", routed.port))
    idle.sendall(b"GET /plain/x HTTP/1.1\r\nHost: x\r\n\r\n")
    slow_body = trickle(routed.port, b"POST /plain/x HTTP/1.1\r\nContent-Length: 9\r\n\r\n")
    try:
        assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")  # then it sends nothing more
        for sock in (slow_head, idle, slow_body):
            sock.settimeout(BODY_S + 20)
        for sock in (slow_head, idle):
            assert sock.recv(65536) == b""  # closed, with no answer
            assert time.monotonic() - began < HEAD_S + 10
        assert status_of(slow_body.recv(65536)) == 408
        assert time.monotonic() - began < BODY_S + 10
    finally:
        for sock in (slow_head, idle, slow_body):
            sock.close()
    assert routed.service("plain")["statuses"] == {"200": 1}


def test_a_body_over_the_buffer_is_streamed_whole_after_100_continue(routed: Routed) -> None:
    plain(routed, "plain", "HTTP/1.1")
    body = bytes(range(97, 123)) * 40_000  # about 1 MiB, four times the buffer
    head = f"POST /plain/up HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    with socket.create_connection(("127.0.0.1", routed.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body + b"GET /plain/next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while piece := sock.recv(1 << 20):  # this answer, then the next request's
            answer += piece
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer[:300]
    assert b'"path": "/next"' in answer
    assert json_body(answer)["body"].encode() == body
