"""A simulated twin of `nvidia-cuda-mps-control` for simulated nodes: same command line, commands.

    mps_twin.py -d | -f     the control daemon, in the background or the foreground
    mps_twin.py             a client: commands on stdin, one a line, answers on stdout

As with the real daemon, CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) says where it listens
and CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps) where control.log and server.log go. It
listens on a Unix socket named `control` in the pipe directory; the simulated driver connects
there at cuInit (native/simcuda/mps.c), and the daemon starts a server for the client's user if
none runs, as the real one does. A server is a plain process of its user (`sleep`) that does
no work (the simulated driver runs the kernels) and goes when its control daemon goes; killing
it fails its clients' next launches, as a real server's death does. One server per user at a
time: a client of another user is refused while one runs (the real daemon queues it until the
running server's clients are done). Client priority as documented: CUDA_MPS_CLIENT_PRIORITY
in the daemon's environment, or `set_default_client_priority`, is the default for clients that
connect later (0 normal, 1 below normal); a client's own variable wins (the simulated driver
reads it).

Standard library only, so it starts fast with `python -S -E`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
BANNER = "gpupool simulated MPS control daemon (a twin of nvidia-cuda-mps-control; no GPU)"
_READY_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1


def command() -> list[str]:
    """How to run the twin in place of `nvidia-cuda-mps-control`."""
    return [sys.executable, "-S", "-E", str(Path(__file__).resolve())]


def _dirs() -> tuple[Path, Path]:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR
    return Path(pipe), Path(log)


def _log(directory: Path, name: str, message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError), (directory / name).open("a") as out:
        out.write(f"[{stamp}] {message}\n")


def _percent(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise ValueError(text)
    return value


def _client_priority(text: str) -> str:
    if text not in ("0", "1"):
        raise ValueError(f"{text!r} is not 0 (normal) or 1 (below normal)")
    return text


def _server_setup(uid: int | None) -> Callable[[], None]:
    """What a server does between fork and exec: become its user, then ask for SIGTERM when the
    control daemon dies (Linux; in this order, as a change of user clears that request)."""

    try:
        gid = pwd.getpwuid(uid).pw_gid if uid is not None else None
    except KeyError:
        gid = uid  # a uid with no passwd entry: its own number as its group

    def setup() -> None:
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return setup


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    uid: int
    percent: float
    clients: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.process.pid

    def live_clients(self) -> list[int]:
        self.clients = {pid for pid in self.clients if Path(f"/proc/{pid}").exists()}
        return sorted(self.clients)


class Control:
    """The daemon's state: its servers (one per user), defaults, and the commands on them."""

    def __init__(self, pipe_dir: Path, log_dir: Path, default_priority: str) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.servers: dict[int, Server] = {}
        self.default_percent = 100.0
        self.default_pinned: dict[int, str] = {}
        self.default_priority = default_priority
        self.quitting = False

    def log(self, message: str) -> None:
        _log(self.log_dir, "control.log", message)

    def reap(self) -> None:
        """Forget servers that died (killed, or their fatal fault), and say so in the log."""
        for pid, server in list(self.servers.items()):
            status = server.process.poll()
            if status is not None:
                del self.servers[pid]
                how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
                _log(self.log_dir, "server.log", f"Server {pid} exited ({how})")
                self.log(f"Server {pid} exited ({how})")

    def start_server(self, uid: int) -> Server:
        for server in self.servers.values():
            if server.uid == uid:
                return server
        if self.servers:
            running = next(iter(self.servers.values()))
            raise RuntimeError(f"a server of uid {running.uid} runs (pid {running.pid})")
        user = uid if os.geteuid() == 0 and uid != os.geteuid() else None
        # a plain process of the user (any user can run sleep, not always this Python) that
        # goes when its control daemon goes, as a server without its control daemon does
        process = subprocess.Popen(
            ["sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_server_setup(user),
        )
        server = Server(process, uid, self.default_percent)
        self.servers[process.pid] = server
        self.log(f"Starting new server {process.pid} for user {uid}")
        _log(self.log_dir, "server.log", f"Server {process.pid} started (simulated)")
        return server

    def server(self, pid: str) -> Server:
        server = self.servers.get(int(pid))
        if server is None:
            raise RuntimeError(f"no server with pid {pid}")
        return server

    def handle(self, line: str) -> str:
        """One command's answer (empty when the command has nothing to say)."""
        words = line.split()
        if not words:
            return ""
        self.reap()
        command, args = words[0], words[1:]
        self.log(f"Command: {line}")
        try:
            return self._dispatch(command, args)
        except (RuntimeError, ValueError, IndexError, OSError) as err:
            return f"error: {command}: {err}"

    def _dispatch(self, command: str, args: list[str]) -> str:
        if command == "get_server_list":
            return "\n".join(str(pid) for pid in self.servers)
        if command == "start_server" and args[:1] == ["-uid"]:
            self.start_server(int(args[1]))
            return ""
        if command in ("get_client_list", "get_device_client_list") and args:
            return "\n".join(str(pid) for pid in self.server(args[0]).live_clients())
        if command == "set_default_active_thread_percentage":
            self.default_percent = _percent(args[0])
            return f"{self.default_percent:.1f}"
        if command == "get_default_active_thread_percentage":
            return f"{self.default_percent:.1f}"
        if command == "set_active_thread_percentage":
            server = self.server(args[0])
            server.percent = _percent(args[1])
            return f"{server.percent:.1f}"
        if command == "get_active_thread_percentage":
            return f"{self.server(args[0]).percent:.1f}"
        if command == "set_default_device_pinned_mem_limit":
            self.default_pinned[int(args[0])] = args[1]
            return ""
        if command == "get_default_device_pinned_mem_limit":
            return self.default_pinned.get(int(args[0]), "0")
        if command == "set_default_client_priority":
            self.default_priority = _client_priority(args[0])
            return ""
        if command == "get_default_client_priority":
            return self.default_priority
        if command == "terminate_client":
            client = int(args[1])
            if client not in self.server(args[0]).live_clients():
                raise RuntimeError(f"{client} is not a client of server {args[0]}")
            os.kill(client, signal.SIGKILL)
            return ""
        if command == "shutdown_server":
            self.server(args[0]).process.terminate()
            return ""
        if command == "gpupool_sim_client":  # the simulated driver's hello at cuInit
            server = self.start_server(int(args[1]))
            server.clients.add(int(args[0]))
            self.log(f"New client {args[0]} connected to server {server.pid}")
            return f"server {server.pid} {server.percent:.1f} {self.default_priority}"
        if command == "quit":
            self.quitting = True
            return ""
        raise RuntimeError("unknown command")

    def stop_servers(self) -> None:
        for server in self.servers.values():
            server.process.terminate()
        for server in self.servers.values():
            try:
                server.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.process.kill()
        self.reap()


def _answer(control: Control, conn: socket.socket) -> None:
    conn.settimeout(5)
    data = b""
    with contextlib.suppress(OSError):
        while b"\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        reply = control.handle(data.decode(errors="replace").strip())
        conn.sendall(reply.encode() + b"\n")


def serve(ready_fd: int | None = None) -> int:
    """Run the control daemon until `quit` (or SIGTERM)."""
    pipe_dir, log_dir = _dirs()
    try:
        priority = _client_priority(os.environ.get("CUDA_MPS_CLIENT_PRIORITY") or "0")
    except ValueError as err:
        message = f"CUDA_MPS_CLIENT_PRIORITY {err}"
        with contextlib.suppress(OSError):
            log_dir.mkdir(parents=True, exist_ok=True)
        _log(log_dir, "control.log", f"Failed to start: {message}")
        print(f"nvidia-cuda-mps-control (simulated): {message}", file=sys.stderr)
        return 1
    control = Control(pipe_dir, log_dir, priority)
    address = pipe_dir / "control"
    try:
        pipe_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        if _ask(pipe_dir, "get_server_list") is not None:
            control.log("An instance of this daemon is already running")
            return 1
        address.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(address))
        listener.listen(64)
    except OSError as err:
        control.log(f"Failed to start: {err}")
        print(f"nvidia-cuda-mps-control (simulated): {err}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: setattr(control, "quitting", True))
    control.log(f"{BANNER}: started in {pipe_dir}")
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    try:
        while not control.quitting:
            with contextlib.suppress(InterruptedError):
                readable, _, _ = select.select([listener], [], [], 0.2)
                if readable:
                    conn, _ = listener.accept()
                    with conn:
                        _answer(control, conn)
            control.reap()
    finally:
        control.stop_servers()
        listener.close()
        address.unlink(missing_ok=True)
        control.log("Control daemon exited")
    return 0


def daemonize() -> int:
    """`-d`: detach, and return once the daemon listens (exit 1 when it could not start)."""
    read_fd, write_fd = os.pipe()
    if os.fork() > 0:
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], _READY_TIMEOUT_S)
        started = bool(ready) and os.read(read_fd, 1) == b"1"
        return 0 if started else 1
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os._exit(serve(write_fd))


def _ask(pipe_dir: Path, line: str) -> str | None:
    """One command's answer, or None when no daemon listens in `pipe_dir`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        try:
            conn.connect(str(pipe_dir / "control"))
            conn.sendall(line.encode() + b"\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        except OSError:
            return None
    return data.decode(errors="replace").rstrip("\n")


def client() -> int:
    """Commands on stdin, one a line; each answer on stdout."""
    pipe_dir, _ = _dirs()
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = _ask(pipe_dir, line.strip())
        if answer is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        if answer:
            print(answer, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        return daemonize()
    if argv == ["-f"]:
        return serve()
    if argv:
        print("usage: nvidia-cuda-mps-control (simulated) [-d | -f]", file=sys.stderr)
        return 1
    return client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
