"""Whose a socket is, as the service manager (a replica's listener) and the router (the socket
that accepted its connection) ask the kernel: sock_diag, and the /proc/net/tcp scan where
sock_diag is not offered, give the same uid, for IPv4 and dual-stack listeners, and a real
second user's uid for theirs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from tests.users import user_env, users

from gpupool.isolation.sock_owner import (
    accepting_uid,
    listener_uid,
    scanned_listener_uid,
    scanned_uid,
)

#: listens on 127.0.0.1, prints its port, and holds what it accepts until stdin closes
LISTENER = """
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")])
def test_both_ways_name_the_listeners_uid(family: int, host: str) -> None:
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        with socket.create_connection(("127.0.0.1", server.getsockname()[1])) as sock:
            assert accepting_uid(sock) == scanned_uid(sock) == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="creates a Unix user: needs root")
def test_another_users_listener_is_named_as_theirs() -> None:
    with users(1, "gppeer") as (mallory,):
        listener = subprocess.Popen(
            [sys.executable, "-c", LISTENER],
            user=mallory.uid,
            group=mallory.gid,
            env=user_env(mallory),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert listener.stdout is not None
            port = int(listener.stdout.readline())
            with socket.create_connection(("127.0.0.1", port)) as sock:
                assert accepting_uid(sock) == scanned_uid(sock) == mallory.uid
            assert listener_uid(port) == scanned_listener_uid(port) == mallory.uid
        finally:
            listener.kill()
            listener.wait()
