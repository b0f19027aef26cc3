"""The router's bounds on its clients, so that none can take descriptors, memory or replica slots
from the others: connections in all and per peer address, and the time a connection may take
to send a head or a body.

The arithmetic (docs/limits.md): a connection holds at most a head (MAX_HEAD, twice over in the
reader's buffer), a body's buffer (BODY_BUFFER) and one piece its parser read ahead (PIECE)
before it takes a replica, so one peer holds at most about MAX_PER_PEER * 448 KiB (56 MiB) and
all of them MAX_CONNECTIONS times that; each
connection is at most two descriptors (the client's and one to a replica).
"""

from __future__ import annotations

from collections import Counter

#: client connections open at once; more are answered 503 and closed
MAX_CONNECTIONS = 2048
#: client connections from one address at once; more are answered 503 and closed
MAX_PER_PEER = 128
#: seconds a connection may take to send a whole head, counted from its opening or from its last
#: answer: the time to send a head and the idle keep-alive time in one
HEAD_S = 30.0
#: seconds a request may take to send its body after its head (streamed or not)
BODY_S = 60.0
#: seconds a client may take to take in the next piece of its answer (a replica waits meanwhile)
SEND_S = 30.0


class Connections:
    """The client connections open, by peer address (event loop only: no lock)."""

    def __init__(self) -> None:
        self._by_peer: Counter[str] = Counter()
        self.total = 0

    def admit(self, peer: str) -> str | None:
        """Count a new connection from `peer`; why not, if it is one too many (then uncounted)."""
        if self.total >= MAX_CONNECTIONS:
            return f"the router has {MAX_CONNECTIONS} connections open"
        if self._by_peer[peer] >= MAX_PER_PEER:
            return f"{MAX_PER_PEER} connections from {peer} are open"
        self._by_peer[peer] += 1
        self.total += 1
        return None

    def release(self, peer: str) -> None:
        self.total -= 1
        self._by_peer[peer] -= 1
        if not self._by_peer[peer]:
            del self._by_peer[peer]
