"""The router and the replicas' lifecycle: streaming, a crash, restarts with backoff, a replica
that never becomes ready, bad input, and a daemon killed with -9 (real processes throughout)."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import httpx
from tests.agent.daemon_support import cli, until
from tests.agent.services_support import Routed, event_times, routed_on, start_routed

routed = routed_on()


def test_a_token_stream_is_passed_through_chunk_by_chunk(routed: Routed) -> None:
    routed.create("gen", "--token-s", "0.25")
    routed.ready("gen")
    headers, reads = event_times(routed.base, "/gen/stream?tokens=5")
    assert headers["status"] == "200"
    assert headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    body = b"".join(piece for _, piece in reads)
    assert body.count(b"data: token ") == 5 and body.endswith(b"0\r\n\r\n")
    # each token came on its own, as the replica made it: not held back until the end
    first_token = next(at for at, piece in reads if b"token 0" in piece)
    last_token = next(at for at, piece in reads if b"token 4" in piece)
    assert last_token - first_token > 0.75, reads
    assert len(reads) >= 5


def test_a_client_gone_mid_stream_frees_the_replica_slot_at_once(routed: Routed) -> None:
    routed.create("gen", "--token-s", "0.2", concurrency=1)
    routed.ready("gen")
    sock = socket.create_connection(("127.0.0.1", routed.port), timeout=30)
    sock.sendall(b"GET /gen/stream?tokens=100 HTTP/1.1\r\nHost: x\r\n\r\n")  # 20 s of tokens
    seen = b""
    while b"token 1" not in seen:
        seen += sock.recv(65536)
    sock.close()  # gone mid-stream
    began = time.monotonic()
    # the router cuts the replica's request at its next token (the replica stops writing) and
    # gives its one slot to the next request, long before the stream would have ended
    assert until(lambda: routed.service("gen")["in_flight"] == 0, timeout=10)
    assert httpx.get(f"{routed.base}/gen/ping", timeout=30).status_code == 200
    assert time.monotonic() - began < 10


def test_a_client_reset_before_its_answer_frees_the_replica_slot_at_once(routed: Routed) -> None:
    routed.create("held", concurrency=1)
    routed.ready("held")
    # a client that half-closes after its request still gets its answer
    with socket.create_connection(("127.0.0.1", routed.port), timeout=30) as polite:
        polite.sendall(b"GET /held/infer?delay=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        polite.shutdown(socket.SHUT_WR)
        assert polite.recv(65536).startswith(b"HTTP/1.1 200 ")
    gone = socket.create_connection(("127.0.0.1", routed.port), timeout=30)
    gone.sendall(b"GET /held/infer?delay=60 HTTP/1.1\r\nHost: x\r\n\r\n")  # held 60 s
    assert until(lambda: routed.service("held")["in_flight"] == 1, timeout=10)
    gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()  # a reset, before the answer's first byte
    began = time.monotonic()
    # the router cuts the replica's request and gives its one slot to the next request
    assert until(lambda: routed.service("held")["in_flight"] == 0, timeout=10)
    assert httpx.get(f"{routed.base}/held/infer", timeout=30).status_code == 200
    assert time.monotonic() - began < 10
    # the cut one is no replica's failure: not a 502
    counted = until(lambda: routed.service("held")["statuses"] == {"200": 2}, timeout=5)
    assert counted, routed.service("held")


def test_a_crashed_replica_fails_its_requests_with_502_and_is_restarted(routed: Routed) -> None:
    routed.create("fragile", concurrency=8)
    routed.ready("fragile")
    pid = httpx.get(f"{routed.base}/fragile/infer").json()["pid"]
    answers: list[int] = []

    def slow() -> None:
        answers.append(httpx.get(f"{routed.base}/fragile/infer?delay=5", timeout=30).status_code)

    threads = [threading.Thread(target=slow) for _ in range(3)]
    for thread in threads:
        thread.start()
    assert until(lambda: routed.service("fragile")["in_flight"] == 3, timeout=10)
    os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(30)
    assert answers == [502, 502, 502]  # failed and said so, none silently dropped
    # requests sent meanwhile wait for the replacement, and are answered
    later = httpx.get(f"{routed.base}/fragile/infer", timeout=30)
    assert later.status_code == 200 and later.json()["pid"] != pid
    # the daemon's counts mirror the router process's, a moment (COUNTERS_S) late
    counted = until(lambda: routed.service("fragile")["statuses"] == {"200": 2, "502": 3})
    service = routed.service("fragile")
    assert counted and service["statuses"] == {"200": 2, "502": 3}, service["statuses"]
    assert service["restarts"] == 1
    assert any(
        "exit code" in e["detail"] and "next start in 1s" in e["detail"] for e in service["events"]
    )


def test_a_replica_that_keeps_exiting_is_restarted_with_a_growing_backoff(routed: Routed) -> None:
    routed.create("crashy", argv=["/bin/sh", "-c", "echo starting; exit 3"])
    service = until(lambda: (s := routed.service("crashy"))["restarts"] >= 3 and s, timeout=30)
    assert service, routed.service("crashy")
    assert "exit code 3" in service["problem"], service["problem"]
    started = [e["at"] for e in service["events"] if "started on port" in e["detail"]]
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9, gaps  # 1 s, then 2 s
    logs = cli("service", "logs", "crashy", url=routed.daemon.url)
    assert logs.returncode == 0 and "starting" in logs.stdout, logs


def test_a_replica_that_never_becomes_ready_is_stopped_and_the_service_says_why(
    routed: Routed,
) -> None:
    routed.create("mute", argv=["/bin/sleep", "60"], ready_timeout_s=1.5)
    service = until(lambda: (s := routed.service("mute"))["problem"] and s, timeout=20)
    assert service, routed.service("mute")
    assert "never became ready within 1.5s" in service["problem"]
    assert "nothing listens on its $PORT" in service["problem"]
    shown = cli("service", "ls", url=routed.daemon.url)
    assert "never became ready" in shown.stdout
    # one that listens and never answers holds no checker: its check gives up within a second
    silent = "import os, socket, time; s = socket.socket(); "
    silent += "s.bind(('127.0.0.1', int(os.environ['PORT']))); s.listen(); time.sleep(60)"
    routed.create("silent", argv=[sys.executable, "-c", silent], ready_timeout_s=1.5)
    quiet = until(lambda: (s := routed.service("silent"))["problem"] and s, timeout=20)
    assert quiet and "TimeoutError" in quiet["problem"], routed.service("silent")
    # no replica: the request waits, then is refused with 503 and Retry-After (not here: 404
    # for a service that does not exist)
    missing = httpx.get(f"{routed.base}/nothing/x")
    assert missing.status_code == 404 and missing.json()["error"] == "NotFound"


def test_bad_input_gets_one_line_and_changes_nothing(routed: Routed) -> None:
    url = routed.daemon.url
    routed.create("one", min_replicas=0, max_replicas=1, idle_s=60)
    cases = [
        (("service", "create", "one", "--", "/bin/true"), 2, "already exists"),
        (("service", "create", "two", "--replicas", "3..1", "--", "/bin/true"), 2, "above MAX"),
        (("service", "create", "two", "--memory", "60Gi", "--", "/bin/true"), 3, "never fit"),
        (("service", "create", "Two", "--", "/bin/true"), 2, "invalid service name"),
        (("service", "create", "two"), 2, "no command given"),
        (("service", "describe", "nope"), 2, "no service 'nope'"),
        (("service", "scale", "nope", "1..2"), 2, "no service 'nope'"),
        (("service", "scale", "one", "2..1"), 2, "above MAX"),
        (("service", "delete", "nope"), 2, "no service 'nope'"),
        (("service", "update", "one", "--concurrency", "0"), 2, "--concurrency"),
    ]
    for args, code, words in cases:
        done = cli(*args, url=url)
        assert done.returncode == code, (args, done)
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    listed = routed.daemon.call("GET", "/v1/services")["services"]
    assert [s["name"] for s in listed] == ["one"] and listed[0]["generation"] == 1
    answer = httpx.post(
        f"{routed.base}/one/infer", content=b"x" * 10
    )  # a request while it starts from zero
    assert answer.status_code == 200
    closing = httpx.get(f"{routed.base}/one/infer", headers={"Connection": "close"})
    assert closing.status_code == 200 and closing.headers.get("connection") == "close"
    smuggled = httpx.post(
        f"{routed.base}/one/infer",
        content=b"0\r\n\r\n",
        headers={"Transfer-Encoding": "chunked", "Content-Length": "5"},
    )
    assert smuggled.status_code == 400 and smuggled.json()["error"] == "BadRequest"
    assert cli("service", "delete", "one", url=url).returncode == 0
    gone = httpx.get(f"{routed.base}/one/infer")
    assert gone.status_code == 404 and "no service" in gone.json()["message"]


def test_replicas_outlive_a_daemon_killed_with_9_and_are_adopted(
    routed: Routed, tmp_path: Path
) -> None:
    routed.create("steady", min_replicas=2, max_replicas=2)
    before = routed.ready("steady", 2)
    jobs = sorted(r["job_id"] for r in before["replica_list"])
    routed.daemon.kill()
    again = start_routed(tmp_path)  # the same state dir, a new router port
    try:
        after = again.ready("steady", 2, timeout=30)
        assert sorted(r["job_id"] for r in after["replica_list"]) == jobs
        assert httpx.get(f"{again.base}/steady/infer").status_code == 200
        assert any("adopted" in e["detail"] for e in after["events"])
    finally:
        again.daemon.stop()
