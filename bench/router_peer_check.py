"""What the checks of a replica's owner cost, with many sockets open.

After each connect to a replica the router asks the kernel whose listener accepted the
connection, and each health check asks whose listener holds the replica's port
(gpupool.isolation.sock_owner: a sock_diag lookup of the connection's other end, a sock_diag dump of
the listeners). The other way is to scan /proc/net/tcp, a line per socket on the host. This
opens N loopback connections (2N sockets, plus a listener), then times both ways for each
question. Usage:

    python bench/router_peer_check.py [--connections N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

from gpupool.isolation.sock_owner import (
    accepting_uid,
    listener_uid,
    scanned_listener_uid,
    scanned_uid,
)


def timed_ms(probe: Callable[[Any], object], asked: object, rounds: int) -> dict[str, float]:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        probe(asked)
        times.append((time.perf_counter() - began) * 1000)
    return {"p50_ms": round(statistics.median(times), 3), "max_ms": round(max(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--connections", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    held = []
    for _ in range(args.connections):
        held.append(socket.create_connection(server.getsockname()))
        held.append(server.accept()[0])
    probe, port = held[-2], server.getsockname()[1]
    assert accepting_uid(probe) == scanned_uid(probe)
    assert listener_uid(port) == scanned_listener_uid(port)
    rows = {
        "connection: sock_diag lookup": timed_ms(accepting_uid, probe, args.rounds),
        "connection: /proc scan": timed_ms(scanned_uid, probe, args.rounds),
        "listener: sock_diag dump": timed_ms(listener_uid, port, args.rounds),
        "listener: /proc scan": timed_ms(scanned_listener_uid, port, args.rounds),
    }
    print(f"{args.connections} connections open ({2 * args.connections + 1} sockets)")
    for name, row in rows.items():
        print(f"{name:<30} p50 {row['p50_ms']:>9} ms   max {row['max_ms']:>9} ms")
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
