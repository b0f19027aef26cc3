"""The router's process: `python -m gpupool.api.router_proc`, started by the daemon.

The daemon (router_link.py) binds `--router HOST:PORT` and starts this process in a session of
its own, handing it the listening socket (--fd): a signal to the daemon's process group, the
daemon's death or its upgrade do not reach it. It serves that socket with the last table of
services a daemon sent over the control channel (router_messages.py), whether a daemon is
attached or not: a daemon killed with -9, or stopped to be upgraded, loses no request a replica
can serve, and the next daemon attaches to it again. With no daemon attached for ALONE_S it
stops (the requests in flight are answered first); so does it on SIGTERM, or when a daemon
tells it to exit (the daemon replaces it: `--router` changed or was dropped).

It runs as the daemon's user, like the router thread it replaces: it runs no replica's code
and takes no user input but the HTTP it proxies. The control socket is 0600 and a connection
from any other uid than its own is closed unread (SO_PEERCRED).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import time
from pathlib import Path

from gpupool.agent.logs import configure, log
from gpupool.agent.service_traffic import Traffic
from gpupool.api import router_messages as messages
from gpupool.api.router import Router
from gpupool.isolation.sock_owner import peer_uid

#: seconds the router serves with no daemon attached (the last table) before it exits: a
#: restart or an upgrade of the daemon takes far less; a daemon gone for good takes its router
#: with it after this
ALONE_S = 300.0


class Control:
    """The control channel's server side, on the router's event loop."""

    def __init__(self, router: Router, traffic: Traffic, state_dir: Path, listen: str) -> None:
        self.router, self.traffic = router, traffic
        self.path = state_dir / messages.CONTROL_NAME
        self.listen = listen
        self.started = time.time()
        self.daemon: asyncio.StreamWriter | None = None
        self.alone_since = time.monotonic()
        self.done = asyncio.Event()

    async def serve(self) -> None:
        """Take the daemon's connections until it is time to stop."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead router's: this one replaces it
        server = await asyncio.start_unix_server(
            self._connected, path=str(self.path), limit=messages.MAX_LINE
        )
        self.path.chmod(0o600)  # 0700 from the umask at bind: never open to others
        made = self.path.stat()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.done.set)
        self.traffic.on_wait = self._waiting
        try:
            while not self.done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.done.wait(), messages.COUNTERS_S)
                self._tick()
        finally:
            self.traffic.on_wait = None
            server.close()
            self.router.close()
            with contextlib.suppress(OSError):
                if (self.path.stat().st_ino, self.path.stat().st_dev) == (made.st_ino, made.st_dev):
                    self.path.unlink()  # its own, not a successor's

    def _tick(self) -> None:
        if self.daemon is not None:
            counted = messages.counters(self.traffic, self.router.busy)
            self._send(messages.encode("counters", **counted))
        elif time.monotonic() - self.alone_since > ALONE_S:
            log.info("router: no daemon attached for %gs: stopping", ALONE_S)
            self.done.set()

    def _waiting(self, name: str) -> None:
        service = self.traffic.get(name)
        queued = service.queued if service is not None else 0
        self._send(messages.encode("wait", name=name, queued=queued))

    def _send(self, line: bytes) -> None:
        daemon = self.daemon
        if daemon is None:
            return
        if daemon.transport.get_write_buffer_size() > messages.MAX_LINE:
            log.warning("router: the daemon reads nothing of the control channel: detached")
            daemon.close()  # its reader ends, and the router serves alone
            return
        daemon.write(line)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = peer_uid(writer.get_extra_info("socket"))
        if uid != os.geteuid():
            log.warning("router: control connection from uid %d refused", uid)
            writer.close()
            return
        if self.daemon is not None:
            self.daemon.close()  # a daemon restarted: the new one is the one attached
        self.daemon = writer
        hello = {"pid": os.getpid(), "listen": self.listen, "started": self.started}
        hello["version"] = messages.VERSION
        writer.write(messages.encode("hello", **hello))
        try:
            while line := await reader.readline():
                self._handle(messages.decode(line))
        except (ValueError, ConnectionError) as err:  # a bad or too long line, a reset
            log.warning("router: control connection ended: %s", err)
        finally:
            if self.daemon is writer:
                self.daemon, self.alone_since = None, time.monotonic()
            writer.close()

    def _handle(self, message: messages.Message) -> None:
        kind = message["t"]
        if kind == "table":
            messages.apply_table(self.traffic, message)
            self.router.known.set()
        elif kind == "exit":
            log.info("router: the daemon replaces this router: stopping")
            self.router.close()
            self.done.set()
        else:
            raise messages.BadMessage(f"no message {kind[:40]!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpupool.api.router_proc")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, inherited")
    parser.add_argument("--listen", required=True, help="its address, as --router gave it")
    args = parser.parse_args(argv)
    os.umask(0o077)
    configure()
    sock = socket.socket(fileno=args.fd)
    pid_file = args.state_dir / messages.PID_NAME
    written = pid_file.with_name(f".{messages.PID_NAME}.{os.getpid()}")
    written.write_text(f"{os.getpid()}\n")
    written.replace(pid_file)  # whole: a reader never sees it half written
    traffic = Traffic()
    router = Router(traffic, sock)
    log.info("router: serving http://%s/NAME/ (pid %d)", args.listen, os.getpid())
    try:
        router.run(Control(router, traffic, args.state_dir, args.listen).serve)
    finally:
        with contextlib.suppress(OSError):
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()
    log.info("router: stopped")


if __name__ == "__main__":
    main()
