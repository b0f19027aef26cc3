"""One process of bench/listener_flood.py's attacker: keeps COUNT connections open (or trying to
open) to the daemon's TCP listener from SOURCE addresses, each idle or sending half a head a byte
at a time, and opens a new one whenever the daemon closes one. Prints one JSON line a second:
the connections open, those the daemon closed, and how long the longest-lived of those was open.

    python bench/listener_flood_worker.py PORT COUNT idle|slow SECONDS SOURCE...
"""

from __future__ import annotations

import errno
import json
import resource
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field

HALF_HEAD = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
#: Linux's socket option, not named by Python before 3.12
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
#: the slow ones send a byte this often: never idle, never a whole head
TRICKLE_S = 2.0


@dataclass
class Flood:
    port: int
    count: int
    slow: bool
    sources: list[str]
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    #: each open socket's connect time (None while connecting)
    started: dict[socket.socket, float | None] = field(default_factory=dict)
    made: int = 0
    closed: int = 0
    #: the longest a connection the daemon closed had been open, and how many lived >= 1 s
    longest: float = 0.0
    held: int = 0

    def open_one(self) -> None:
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.setblocking(False)
        source = self.sources[self.made % len(self.sources)]
        self.made += 1
        # the port is chosen at connect, for the whole address pair: bind alone would look for
        # a port free of every pair, and soon find none among the daemon's closed connections
        conn.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        try:
            conn.bind((source, 0))
            code = conn.connect_ex(("127.0.0.1", self.port))
        except OSError:
            code = -1
        if code not in (0, errno.EINPROGRESS):
            conn.close()
            return
        self.started[conn] = None
        self.selector.register(conn, selectors.EVENT_WRITE)

    def connected(self, conn: socket.socket) -> None:
        if conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.drop(conn, None)
            return
        self.started[conn] = time.monotonic()
        self.selector.modify(conn, selectors.EVENT_READ)
        if self.slow:
            self.send(conn, HALF_HEAD)

    def send(self, conn: socket.socket, data: bytes) -> None:
        try:
            conn.send(data)
        except OSError:
            self.drop(conn, self.started.get(conn))

    def readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.drop(conn, self.started.get(conn))

    def drop(self, conn: socket.socket, since: float | None) -> None:
        if conn not in self.started:
            return
        del self.started[conn]
        self.selector.unregister(conn)
        conn.close()
        if since is not None:
            self.closed += 1
            lived = time.monotonic() - since
            self.longest = max(self.longest, lived)
            self.held += lived >= 1.0

    def trickle(self) -> None:
        for conn, since in list(self.started.items()):
            if since is not None:
                self.send(conn, b"X")

    def turn(self) -> None:
        while len(self.started) < self.count:
            self.open_one()
        for key, events in self.selector.select(timeout=0.1):
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            if conn not in self.started:
                continue
            if events & selectors.EVENT_WRITE:
                self.connected(conn)
            else:
                self.readable(conn)

    def report(self, elapsed: float) -> str:
        now = time.monotonic()
        ages = [now - since for since in self.started.values() if since is not None]
        return json.dumps(
            {
                "t": round(elapsed, 1),
                "open": len(self.started),
                "connected": len(ages),
                "closed": self.closed,
                "held_1s": self.held,
                "longest_closed_s": round(self.longest, 2),
                "oldest_open_s": round(max(ages, default=0.0), 2),
            }
        )


def main() -> None:
    port, count, mode, seconds, *sources = sys.argv[1:]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    flood = Flood(int(port), min(int(count), hard - 32), mode == "slow", sources)
    start = last_report = last_trickle = time.monotonic()
    while (now := time.monotonic()) - start < float(seconds):
        flood.turn()
        if flood.slow and now - last_trickle >= TRICKLE_S:
            flood.trickle()
            last_trickle = now
        if now - last_report >= 1.0:
            print(flood.report(now - start), flush=True)
            last_report = now
    print(flood.report(time.monotonic() - start), flush=True)


if __name__ == "__main__":
    main()
