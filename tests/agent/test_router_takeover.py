"""A replica's port taken over by another user: when a replica dies, another user who binds its
port at once gets no request of the service's, Authorization headers and all (a real root
daemon and router, a real replica, a real second Unix user)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tests.agent.daemon_support import until
from tests.agent.services_support import Routed, routed_on
from tests.users import user_env, users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")
routed = routed_on()
PLAIN = str(Path(__file__).with_name("plain_replica.py"))
#: binds PORT as soon as it is free, then prints every request that comes, for SECONDS
SQUATTER = """
import socket, sys, time
port, until = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
while True:
    try:
        server.bind(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.0005)
server.listen(64)
print("bound", flush=True)
server.settimeout(0.1)
while time.monotonic() < until:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        continue
    conn.settimeout(0.5)
    try:
        data = conn.recv(65536)
    except OSError:
        data = b""
    if data:
        print(repr(data), flush=True)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 8\\r\\n\\r\\nsquatter")
    conn.close()
"""


def test_a_port_a_dead_replica_left_gets_none_of_its_requests(routed: Routed) -> None:
    argv = [sys.executable, PLAIN, "HTTP/1.0"]  # a connection per request: each one connects
    routed.create("secret", argv=argv, min_replicas=1, max_replicas=1)
    service = routed.ready("secret")
    port = service["replica_list"][0]["port"]
    url = f"{routed.base}/secret/x"
    token = {"Authorization": "Bearer s3cret"}
    pid = httpx.get(url, headers=token).json()["pid"]
    with users(1, "gpsq") as (mallory,):
        squatter = subprocess.Popen(
            [sys.executable, "-c", SQUATTER, str(port), "8"],
            user=mallory.uid,
            group=mallory.gid,
            env=user_env(mallory),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            os.kill(pid, signal.SIGKILL)
            assert squatter.stdout is not None and squatter.stdout.readline() == "bound\n"
            answers = [httpx.get(url, headers=token, timeout=30) for _ in range(20)]
        finally:
            squatter.kill()
            heard, _ = squatter.communicate(timeout=10)
    assert heard == "", heard  # not one byte of a request reached it
    assert all(a.text != "squatter" for a in answers)
    # the requests waited for the replica's replacement, on a port of its own
    assert {a.status_code for a in answers} <= {200, 502}, [a.text for a in answers]
    assert until(lambda: httpx.get(url).status_code == 200, timeout=30)
