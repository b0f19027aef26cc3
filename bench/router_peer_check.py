"""What the router's check of a replica connection's owner costs, with many sockets open.

After each connect to a replica the router asks the kernel whose listener accepted the
connection (gpupool.api.router_peer: one sock_diag lookup of the connection's other end). The
other way is to scan /proc/net/tcp for that socket's line, a line per socket on the host. This
opens N loopback connections (2N sockets, plus a listener), then times both ways for one of
them. Usage:

    python bench/router_peer_check.py [--connections N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import statistics
import time
from pathlib import Path

from gpupool.api.router_peer import accepting_uid


def proc_scan_uid(sock: socket.socket) -> int | None:
    """The uid of the other end of `sock` as /proc/net/tcp gives it (IPv4 loopback)."""
    here_port = sock.getsockname()[1]
    there_port = sock.getpeername()[1]
    local, remote = f"0100007F:{there_port:04X}", f"0100007F:{here_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[7])
    return None


def timed_ms(probe: object, sock: socket.socket, rounds: int) -> dict[str, float]:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        probe(sock)  # type: ignore[operator]
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
    probe = held[-2]
    assert accepting_uid(probe) == proc_scan_uid(probe)
    rows = {
        "sock_diag (exact lookup)": timed_ms(accepting_uid, probe, args.rounds),
        "/proc/net/tcp scan": timed_ms(proc_scan_uid, probe, args.rounds),
    }
    print(f"{args.connections} connections open ({2 * args.connections + 1} sockets)")
    for name, row in rows.items():
        print(f"{name:<26} p50 {row['p50_ms']:>9} ms   max {row['max_ms']:>9} ms")
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
