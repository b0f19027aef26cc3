"""The daemon's end of the router: it finds the router process or starts it, keeps it supplied
with the table of services, mirrors its counters, and starts it again if it dies.

At the daemon's start (`open`): a router already running from an earlier daemon that serves the
same `--router` address is attached to again (no bind: it keeps its socket and its
connections); one serving another address, or any when `--router` is not given, is told to exit
(it answers its requests in flight first), and a new one is started on a socket the daemon binds
(router_proc.py). Then a thread of the daemon (`_loop`) reads the router's messages into the
service manager's Traffic (router_messages.Mirror), sends the table whenever it differs from
the one last sent, and, when the connection ends, connects again or starts a new router.

When the daemon stops, the router stays: it serves with the last table until a daemon attaches
again (a restart, an upgrade) or for router_proc.ALONE_S.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.agent.logs import Failures, log
from gpupool.api import router_messages as messages
from gpupool.api.server import tcp_socket
from gpupool.core.errors import ConfigError
from gpupool.isolation.sock_owner import peer_uid

if TYPE_CHECKING:
    from gpupool.agent.service_manager import ServiceManager

#: seconds the daemon waits for the router's hello when it connects
HELLO_S = 2.0
#: seconds a router started by this daemon has to open its control socket before it is killed
#: and started again
START_S = 10.0
#: seconds between two reads of the channel (and checks of the table)
POLL_S = 0.02
#: seconds the daemon tries to bind the port a router it replaced lets go
REPLACE_S = 5.0
#: seconds a send to the router may block before the connection is given up
SEND_S = 5.0


class RouterLink:
    """The router process, seen from the daemon."""

    def __init__(self, manager: ServiceManager, state_dir: Path, listen: str | None) -> None:
        self._manager = manager
        self._mirror = messages.Mirror(manager.traffic)
        self._state_dir, self._listen = state_dir, listen
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._sent = b""
        self._child: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpupool-router", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Attach to the running router, or replace it, or start one (see the module)."""
        hello = self._connect()
        wanted = {"listen": self._listen, "version": messages.VERSION}
        if hello is not None and all(hello.get(k) == v for k, v in wanted.items()):
            log.info(
                f"router on http://{self._listen}/NAME/: attached to its process {hello['pid']}"
            )
        else:
            if hello is not None:
                log.info(f"router: replacing the one on {hello['listen']} (process {hello['pid']})")
                self._disconnect(messages.encode("exit"))
            if self._listen is None:
                return
            self._start(REPLACE_S if hello is not None else 0.0)
            log.info(f"router on http://{self._listen}/NAME/ for the services")
        self._thread.start()

    def close(self) -> None:
        """The daemon stops: the router stays (router_proc.ALONE_S)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._disconnect()

    def _start(self, retry_s: float = 0.0) -> None:
        """Bind --router and start a router process on it (ConfigError if it cannot bind within
        `retry_s`: a router told to exit lets its port go a moment later)."""
        assert self._listen is not None
        deadline = time.monotonic() + retry_s
        while True:
            try:
                listener = tcp_socket(self._listen, "--router")
                break
            except ConfigError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        output = os.open(self._state_dir / messages.LOG_NAME, flags, 0o600)
        try:
            argv = [sys.executable, "-m", "gpupool.api.router_proc", "--listen", self._listen]
            argv += ["--state-dir", str(self._state_dir), "--fd", str(listener.fileno())]
            self._child = subprocess.Popen(
                argv,
                pass_fds=(listener.fileno(),),
                start_new_session=True,  # the daemon's group's signals and death miss it
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                cwd="/",
            )
        finally:
            os.close(output)
            listener.close()  # the router's alone now: when it dies, the port is free again
        self._started_at = time.monotonic()

    # -- the connection --------------------------------------------------------------------

    def _connect(self) -> messages.Message | None:
        """Connect to the router's control socket and read its hello; None if none answers."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(HELLO_S)
        try:
            sock.connect(str(self._state_dir / messages.CONTROL_NAME))
            if peer_uid(sock) != os.geteuid():
                raise messages.BadMessage("the control socket is not the daemon's user's")
            self._sock, self._buffer, self._sent = sock, b"", b""
            hello = self._next_message()
            if hello is None or hello["t"] != "hello":
                raise messages.BadMessage("no hello")
            self._mirror.hello(hello)
            sock.settimeout(SEND_S)
            return hello
        except (OSError, ValueError, KeyError, TypeError):
            self._disconnect()
            sock.close()
            return None

    def _disconnect(self, last: bytes = b"") -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.sendall(last)
            sock.close()

    def _next_message(self) -> messages.Message | None:
        """One whole line from the router (blocking up to the socket's timeout)."""
        assert self._sock is not None
        while b"\n" not in self._buffer:
            if len(self._buffer) > messages.MAX_LINE:
                raise messages.BadMessage("a line longer than the channel allows")
            data = self._sock.recv(1 << 16)
            if not data:
                return None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return messages.decode(line)

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = Failures("the router's control channel", POLL_S)  # its log, its backoff
        while not self._stop.is_set():
            try:
                if self._sock is None:
                    self._supervise()
                else:
                    self._exchange()
                failures.succeeded()
            except Exception as err:  # a bad message, a reset, a bug: the channel starts over
                self._disconnect()
                self._stop.wait(failures.failed(err))

    def _supervise(self) -> None:
        """No connection: connect again, or start a router if none runs (it died)."""
        if self._connect() is not None:
            return
        child = self._child
        if child is not None and child.poll() is None:
            if time.monotonic() - self._started_at < START_S:
                self._stop.wait(POLL_S)  # still starting
                return
            log.error("router: process %d never opened its control socket: killed", child.pid)
            child.send_signal(signal.SIGKILL)
            child.wait(5)
        log.warning("router: no router process answers: starting one")
        self._start()
        self._stop.wait(POLL_S)

    def _exchange(self) -> None:
        """The router's messages in, the table out if it changed."""
        assert self._sock is not None
        readable, _, _ = select.select([self._sock], [], [], POLL_S)
        if readable:
            data = self._sock.recv(1 << 16)
            if not data:
                log.warning("router: the control connection ended (the router stopped)")
                self._disconnect()
                return
            self._buffer += data
            while b"\n" in self._buffer:
                line, _, self._buffer = self._buffer.partition(b"\n")
                self._handle(messages.decode(line))
            if len(self._buffer) > messages.MAX_LINE:
                raise messages.BadMessage("a line longer than the channel allows")
        if self._manager.settled():  # a restarted daemon's table waits for its adopted replicas
            table = messages.encode("table", **self._mirror.table())
            if table != self._sent:
                self._sock.sendall(table)
                self._sent = table

    def _handle(self, message: messages.Message) -> None:
        kind = message["t"]
        if kind == "counters":
            self._mirror.counters(message)
        elif kind == "wait":
            self._mirror.waiting(message)
        else:
            raise messages.BadMessage(f"no message {str(kind)[:40]!r}")
