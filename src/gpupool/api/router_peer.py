"""Who accepted a connection the router made: the owner of the replica's listener, by sock_diag.

When a replica dies its port is free, and any user may bind it; a request sent there would hand
the service's traffic, Authorization headers and all, to that user. So after each connect the
router asks the kernel (NETLINK_INET_DIAG, one exact lookup of the other end of this very
connection: the socket whose local address is the replica's and whose peer is ours) for that
socket's uid. An accepted socket carries the uid of the listener that accepted it, and sockets
of different users cannot share a port (SO_REUSEPORT requires one uid), so the uid says whose
listener took the connection. An exact lookup costs the same with 20,000 sockets as with 20,
where reading /proc/net/tcp costs a line per socket (bench/router_peer_check.py); that scan is
the fallback where the kernel offers no sock_diag (a sandbox that refuses the netlink family).
"""

from __future__ import annotations

import errno
import socket
import struct
from pathlib import Path

_NETLINK_INET_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_TCP_ESTABLISHED = 1
_TCP_CLOSE_WAIT = 8
_NO_COOKIE = 0xFFFFFFFF
#: /proc/net/tcp's `st` of an accepted connection (established, or closed by its peer)
_ACCEPTED = ("01", "08")
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_REQUEST = struct.Struct("=BBBBI")  # struct inet_diag_req_v2, up to its socket id
#: where struct inet_diag_msg (after the nlmsghdr) has its idiag_state and idiag_uid
_STATE_AT = 1
_UID_AT = 4 + 48 + 12


class PeerUnknown(Exception):
    """The kernel could not say who holds the other end of a connection."""


def accepting_uid(sock: socket.socket) -> int:
    """The uid of the socket at the other end of `sock`, a TCP connection on this host (the one
    a listener accepted for it); PeerUnknown if the kernel has no such socket."""
    try:
        diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_INET_DIAG)
    except OSError:
        return scanned_uid(sock)
    with diag:
        return _diag_uid(diag, sock)


def _diag_uid(diag: socket.socket, sock: socket.socket) -> int:
    family = sock.family
    here, here_port = sock.getsockname()[:2]
    there, there_port = sock.getpeername()[:2]
    # the other end's id: its local address is our peer, its peer is us
    sockid = struct.pack(
        "!HH16s16s", there_port, here_port, _address(family, there), _address(family, here)
    )
    sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    message = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    diag.settimeout(1.0)
    diag.sendto(message + request, (0, 0))
    answer = diag.recv(8192)
    _, kind, _, _, _ = _HEADER.unpack_from(answer)
    if kind == _NLMSG_ERROR:
        error = -struct.unpack_from("=i", answer, _HEADER.size)[0]
        raise PeerUnknown(f"no socket at the other end ({errno.errorcode.get(error, error)})")
    state = answer[_HEADER.size + _STATE_AT]
    if state not in (_TCP_ESTABLISHED, _TCP_CLOSE_WAIT):
        # a listener or a half-open request socket (whose uid the kernel reports as 0)
        raise PeerUnknown(f"the other end is not an accepted connection (TCP state {state})")
    return int(struct.unpack_from("=I", answer, _HEADER.size + _UID_AT)[0])


def scanned_uid(sock: socket.socket) -> int:
    """accepting_uid by /proc/net/tcp and tcp6 (an IPv4 connection may have been accepted by a
    dual-stack listener: its other end is then in tcp6, with mapped addresses)."""
    here, here_port = sock.getsockname()[:2]
    there, there_port = sock.getpeername()[:2]
    wanted = [(_proc(sock.family, there, there_port), _proc(sock.family, here, here_port))]
    if sock.family == socket.AF_INET:
        wanted.append((_proc_mapped(there, there_port), _proc_mapped(here, here_port)))
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) in wanted and fields[3] in _ACCEPTED:
                return int(fields[7])
    raise PeerUnknown("no accepted connection at the other end in /proc/net/tcp")


def _proc(family: int, host: str, port: int) -> str:
    """An address as /proc/net/tcp(6) writes it: 32-bit words in host order, then the port."""
    packed = socket.inet_pton(family, host)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


def _proc_mapped(host: str, port: int) -> str:
    return _proc(socket.AF_INET6, "::ffff:" + host, port)


def _address(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")
