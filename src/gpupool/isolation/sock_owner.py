"""Whose a TCP socket on this host is, asked of the kernel: the listener on a replica's port
(before a replica is taken as ready) and the socket that accepted a connection the router made
(before a request goes on it).

A replica's port is free the moment it dies, and any local user may bind it; a request sent
there would hand the service's traffic, Authorization headers and all, to that user. An accepted
socket carries the uid of the listener that accepted it, and sockets of different users cannot
share a port (SO_REUSEPORT requires one uid), so the uid of a connection's other end says whose
listener took it.

Both are sock_diag requests (NETLINK_INET_DIAG): an exact lookup of one connection's other end,
and a dump of the listening sockets only. Neither walks the host's established connections,
where a scan of /proc/net/tcp reads a line per socket (92 ms with 36,000 sockets,
bench/router_peer_check.py, and the interpreter's lock held meanwhile); the scan is the
fallback where a sandbox offers no sock_diag.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

_NETLINK_INET_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_TCP_ESTABLISHED = 1
_TCP_CLOSE_WAIT = 8
_TCP_LISTEN = 10
_NO_COOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_REQUEST = struct.Struct("=BBBBI")  # struct inet_diag_req_v2, up to its socket id
#: where struct inet_diag_msg (after the nlmsghdr) has its state, source port and uid
_STATE_AT = 1
_SPORT_AT = 4
_UID_AT = 4 + 48 + 12
#: /proc/net/tcp's `st` of an accepted connection (established, or closed by its peer), and of
#: a listener
_ACCEPTED = ("01", "08")
_LISTEN = "0A"
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


class PeerUnknown(Exception):
    """The kernel could not say who holds the other end of a connection."""


def accepting_uid(sock: socket.socket) -> int:
    """The uid of the socket at the other end of `sock`, a TCP connection on this host (the one
    a listener accepted for it); PeerUnknown if the kernel has no such socket."""
    try:
        diag = _diag_socket()
    except OSError:
        return scanned_uid(sock)
    with diag:
        return _diag_uid(diag, sock)


def listener_uid(port: int) -> int | None:
    """The uid owning the socket listening on `port` (any local address), None if none does."""
    try:
        diag = _diag_socket()
    except OSError:
        return scanned_listener_uid(port)
    with diag:
        try:
            return _diag_listener_uid(diag, port)
        except (OSError, PeerUnknown):
            return scanned_listener_uid(port)


def _diag_listener_uid(diag: socket.socket, port: int) -> int | None:
    for family in (socket.AF_INET, socket.AF_INET6):
        request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
        request += bytes(48)  # any socket id: every listener of the family
        for found in _ask(diag, request, _NLM_F_REQUEST | _NLM_F_DUMP):
            if struct.unpack_from("!H", found, _SPORT_AT)[0] == port:
                return int(struct.unpack_from("=I", found, _UID_AT)[0])
    return None


def _diag_socket() -> socket.socket:
    diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_INET_DIAG)
    diag.settimeout(1.0)
    return diag


def _ask(diag: socket.socket, request: bytes, flags: int) -> Iterator[bytes]:
    """Each inet_diag_msg the kernel answers `request` with; PeerUnknown for an error."""
    diag.sendto(
        _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, flags, 1, 0) + request,
        (0, 0),
    )
    while True:
        data = diag.recv(65536)
        at = 0
        while at + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, at)
            if kind == _NLMSG_DONE:
                return
            if kind == _NLMSG_ERROR:
                error = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
                raise PeerUnknown(f"no such socket ({errno.errorcode.get(error, error)})")
            yield data[at + _HEADER.size : at + length]
            at += (length + 3) & ~3
        if not flags & _NLM_F_DUMP:
            return


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
    found = next(_ask(diag, request, _NLM_F_REQUEST), b"")
    state = found[_STATE_AT] if found else 0
    if state not in (_TCP_ESTABLISHED, _TCP_CLOSE_WAIT):
        # a listener or a half-open request socket (whose uid the kernel reports as 0)
        raise PeerUnknown(f"the other end is not an accepted connection (TCP state {state})")
    return int(struct.unpack_from("=I", found, _UID_AT)[0])


def scanned_uid(sock: socket.socket) -> int:
    """accepting_uid by /proc/net/tcp and tcp6 (an IPv4 connection may have been accepted by a
    dual-stack listener: its other end is then in tcp6, with mapped addresses)."""
    here, here_port = sock.getsockname()[:2]
    there, there_port = sock.getpeername()[:2]
    wanted = [(_proc(sock.family, there, there_port), _proc(sock.family, here, here_port))]
    if sock.family == socket.AF_INET:
        wanted.append((_proc_mapped(there, there_port), _proc_mapped(here, here_port)))
    for fields in _proc_lines():
        if (fields[1], fields[2]) in wanted and fields[3] in _ACCEPTED:
            return int(fields[7])
    raise PeerUnknown("no accepted connection at the other end in /proc/net/tcp")


def scanned_listener_uid(port: int) -> int | None:
    """listener_uid by /proc/net/tcp and tcp6."""
    wanted = f"{port:04X}"
    for fields in _proc_lines():
        if fields[3] == _LISTEN and fields[1].rsplit(":", 1)[-1] == wanted:
            return int(fields[7])
    return None


def _proc_lines() -> Iterator[list[str]]:
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7:
                yield fields


def _proc(family: int, host: str, port: int) -> str:
    """An address as /proc/net/tcp(6) writes it: 32-bit words in host order, then the port."""
    packed = socket.inet_pton(family, host)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


def _proc_mapped(host: str, port: int) -> str:
    return _proc(socket.AF_INET6, "::ffff:" + host, port)


def _address(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
