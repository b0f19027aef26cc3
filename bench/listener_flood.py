"""The daemon's listeners under a flood: 20,000 idle or slow TCP connections from one outsider,
then huge request heads, while root uses the API over the Unix socket.

    python bench/listener_flood.py    # as root: it creates (and removes) the outsider

Starts a root daemon on a simulated 1xA30 node with a TCP listener (`--listen 127.0.0.1:PORT
--token-file`), then, as a new ordinary user outside the socket group, runs the attacks of
bench/listener_flood_worker.py in four processes (5,000 connections each, a new one as soon as
the daemon closes one): idle connections from 127.0.0.1; connections trickling half a head from
127.0.0.1; and both from 64 loopback addresses (past the per-address count, the count of all).
Meanwhile root calls `GET /v1/jobs` over the Unix socket, a fresh connection each time, and
`POST /v1/jobs` (`true`) every 20th call, and the daemon's RSS and open descriptors are sampled.
Then a 64 MiB head, and four 200 MiB heads at once, over TCP without a token. Prints a markdown
table (target, measured, verdict); exits 1 when a target is missed. docs/benchmarks/security.md
records a run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon import _cpu_seconds  # noqa: E402
from daemon_support import machine_load, percentile, start_daemon  # noqa: E402
from tests.users import User, create_user, remove_user, user_env  # noqa: E402

MiB = 1 << 20
TOKEN = "flood-token"
WORKER = Path(__file__).resolve().parent / "listener_flood_worker.py"
PROCESSES = 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answer(conn: socket.socket) -> int:
    """The status of one response on `conn`, read whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} bytes")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
    length = int(fields.get(b"content-length", b"0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        body += chunk
    return int(head.split()[1])


@dataclass
class Watch:
    """Root's calls over the Unix socket and samples of the daemon, in a thread."""

    socket_path: Path
    pid: int
    times_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    sockets: list[int] = field(default_factory=list)
    #: each probe kind's times from connect to the daemon's close
    closes: dict[str, list[float]] = field(default_factory=dict)
    #: the daemon's CPU seconds and the time when the watch began
    began: tuple[float, float] = (0.0, 0.0)
    stop: threading.Event = field(default_factory=threading.Event)

    def call(self, n: int) -> None:
        body = json.dumps({"argv": ["true"], "workdir": "/tmp"}).encode()
        request = (
            b"POST /v1/jobs HTTP/1.1\r\nHost: gpupool\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
            if n % 20 == 19
            else b"GET /v1/jobs HTTP/1.1\r\nHost: gpupool\r\n\r\n"
        )
        began = time.perf_counter()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(str(self.socket_path))
                conn.sendall(request)
                status = answer(conn)
        except OSError as err:
            self.failures.append(f"{type(err).__name__}: {err}")
            return
        if status not in (200, 201):
            self.failures.append(f"status {status}")
        elif n % 20 != 19:
            self.times_ms.append((time.perf_counter() - began) * 1000)

    def sample(self) -> None:
        status = Path(f"/proc/{self.pid}/status").read_text()
        rss = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        self.rss_mib.append(int(rss.split()[1]) / 1024)
        links = []
        for name in os.listdir(f"/proc/{self.pid}/fd"):
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"/proc/{self.pid}/fd/{name}"))
        self.fds.append(len(links))
        self.sockets.append(sum(link.startswith("socket:") for link in links))

    def cpu_share(self) -> float:
        """The daemon's CPU time since the watch began, as a share of one core."""
        cpu, wall = self.began
        return (_cpu_seconds(self.pid) - cpu) / (time.monotonic() - wall)

    def run(self) -> None:
        self.began = (_cpu_seconds(self.pid), time.monotonic())
        n = 0
        while not self.stop.is_set():
            self.call(n)
            if n % 10 == 0:
                self.sample()
            n += 1
            time.sleep(0.02)


#: what a probe sends before it waits: nothing, half a head, or a whole request (then idle)
PROBES = {
    "idle": b"",
    "half a head": b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    "idle after a request": b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
}
#: the probes' own address, which the outsider does not use
PROBE_SOURCE = "127.0.0.200"


def probe(port: int, kind: str, closes: dict[str, list[float]]) -> None:
    """One connection of `kind` from PROBE_SOURCE: how long from connected until the daemon
    closes it (or, as `kind (not connected)`, how long its connect took to fail: under a flood
    the kernel's queue is full and a SYN waits its turn)."""
    began = time.monotonic()
    try:
        conn = socket.create_connection(
            ("127.0.0.1", port), timeout=60, source_address=(PROBE_SOURCE, 0)
        )
    except OSError:
        closes.setdefault(f"{kind} (not connected)", []).append(time.monotonic() - began)
        return
    began = time.monotonic()
    with conn, contextlib.suppress(OSError):
        conn.sendall(PROBES[kind])
        while conn.recv(65536):
            pass
    closes.setdefault(kind, []).append(time.monotonic() - began)


def probing(port: int, watch: Watch) -> None:
    """A probe of each kind every 3 s until the watch stops; then waits for the last ones."""
    started: list[threading.Thread] = []
    while not watch.stop.wait(3.0):
        for kind in PROBES:
            started.append(threading.Thread(target=probe, args=(port, kind, watch.closes)))
            started[-1].start()
    for thread in started:
        thread.join(timeout=70)


@contextlib.contextmanager
def watching(socket_path: Path, pid: int, port: int | None = None) -> Iterator[Watch]:
    """Root's calls and the samples, and with `port` the probes, while the block runs."""
    watch = Watch(socket_path, pid)
    threads = [threading.Thread(target=watch.run, daemon=True)]
    if port is not None:
        threads.append(threading.Thread(target=probing, args=(port, watch), daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield watch
    finally:
        watch.stop.set()
        for thread in threads:
            thread.join(timeout=90)


def tcp_sockets(pid: int) -> int:
    """The daemon's open TCP sockets, its listener included."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            inodes |= {line.split()[9] for line in Path(table).read_text().splitlines()[1:]}
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{name}")
            count += link.startswith("socket:[") and link[8:-1] in inodes
    return count


def flood(
    user: User, port: int, modes: list[str], sources: list[str], seconds: float, nice: int
) -> dict[str, Any]:
    """The outsider's processes, one per mode, for `seconds` at `nice`; their last reports."""
    each = 20_000 // len(modes)
    worker = ["nice", "-n", str(nice), sys.executable, str(WORKER), str(port), str(each)]
    workers = [
        subprocess.Popen(
            [*worker, mode, str(seconds), *sources],
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            env=user_env(user),
            stdout=subprocess.PIPE,
            text=True,
        )
        for mode in modes
    ]
    last = [
        json.loads(worker.communicate(timeout=seconds + 120)[0].splitlines()[-1])
        for worker in workers
    ]
    return {
        "connected": sum(r["connected"] for r in last),
        "closed": sum(r["closed"] for r in last),
        "held_1s": sum(r["held_1s"] for r in last),
        "longest_closed_s": max(r["longest_closed_s"] for r in last),
        "oldest_open_s": max(r["oldest_open_s"] for r in last),
    }


def send_head(port: int, size: int) -> str:
    """A request head with a header line of `size` bytes, over TCP without a token: the
    status, or why there is none."""
    head = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        sender = threading.Thread(target=lambda: _send_all(conn, head), daemon=True)
        sender.start()
        try:
            return str(answer(conn))
        except OSError as err:
            return f"{type(err).__name__}"
        finally:
            sender.join(timeout=60)


def _send_all(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the daemon closes before taking it all
        conn.sendall(data)


@dataclass
class Table:
    rows: list[str] = field(default_factory=list)
    missed: int = 0

    def add(self, case: str, measured: str, target: str, met: bool) -> None:
        self.rows.append(f"| {case} | {measured} | {target} | {'met' if met else '**missed**'} |")
        self.missed += not met


def phase(table: Table, name: str, watch: Watch, run: dict[str, Any], base_rss: float) -> None:
    """The rows of one flood: root's calls during it, the daemon's growth, the connections."""
    times, rss = watch.times_ms, max(watch.rss_mib, default=float("nan"))
    cpu = watch.cpu_share()
    p99 = percentile(times, 99)
    table.add(
        f"{name}: `GET /v1/jobs` over the Unix socket, a new connection each",
        f"{len(times)} calls, p50 {percentile(times, 50):.1f} ms, p99 {p99:.1f} ms, max "
        f"{max(times, default=0):.0f} ms; {len(watch.failures)} failed (GET or POST)"
        + (f": {watch.failures[0]}" if watch.failures else ""),
        "p99 < 50 ms, none failed",
        p99 < 50 and not watch.failures,
    )
    table.add(
        f"{name}: the daemon",
        f"RSS {base_rss:.0f} -> at most {rss:.0f} MiB; at most {max(watch.fds)} open files, "
        f"{max(watch.sockets)} of them sockets; CPU {cpu:.0%} of a core",
        "RSS + < 50 MB",
        rss - base_rss < 50 * 1e6 / MiB,
    )
    table.add(
        f"{name}: the outsider's connections",
        f"{run['closed']:,} closed by the daemon, {run['held_1s']:,} of them after 1 s or more, "
        f"the longest after {run['longest_closed_s']:.1f} s; {run['connected']:,} open at the end "
        f"(the oldest {run['oldest_open_s']:.1f} s, most of them unaccepted in the kernel's queue)",
        "",
        True,
    )
    probes = dict(sorted(watch.closes.items()))
    longest = max(
        (max(times) for kind, times in probes.items() if kind in PROBES), default=float("nan")
    )
    table.add(
        f"{name}: root's probes from another address, every 3 s",
        "; ".join(
            f"{kind}: {len(times)}, "
            + ("failed after" if kind not in PROBES else "closed after")
            + f" {min(times):.1f} to {max(times):.1f} s"
            for kind, times in probes.items()
        ),
        "each connected one closed within 30 s",
        longest < 30,
    )


def heads(table: Table, port: int, watch: Watch, base_rss: float) -> None:
    status = send_head(port, 64 * MiB)
    watch.sample()
    grew = max(watch.rss_mib) - base_rss
    table.add(
        "one 64 MiB header line over TCP, no token",
        f"{status}; RSS + {grew:.1f} MiB at most",
        "431, RSS not grown by it",
        status == "431" and grew < 16,
    )
    done: list[str] = []
    senders = [
        threading.Thread(target=lambda: done.append(send_head(port, 200 * MiB))) for _ in range(4)
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=300)
    watch.sample()
    grew = max(watch.rss_mib) - base_rss
    table.add(
        "four 200 MiB header lines at once over TCP",
        f"{', '.join(sorted(done))}; RSS + {grew:.1f} MiB at most",
        "431 each, RSS not grown by them",
        done == ["431"] * 4 and grew < 16,
    )


def _phases() -> list[tuple[str, list[str], list[str]]]:
    many = [f"127.0.0.{n}" for n in range(2, 66)]
    return [
        ("20,000 idle from 127.0.0.1", ["idle"] * PROCESSES, ["127.0.0.1"]),
        ("20,000 sending half a head from 127.0.0.1", ["slow"] * PROCESSES, ["127.0.0.1"]),
        ("20,000 idle or half a head from 64 addresses", ["idle", "idle", "slow", "slow"], many),
    ]


def _raise_open_files(each: int) -> None:
    """The outsider's processes inherit this limit: room for their connections (the daemon,
    already started, keeps its own)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(hard, each + 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))


def run(root: Path, user: User, port: int, pid: int, args: argparse.Namespace) -> Table:
    table = Table()
    sock = root / "state" / "gpupool.sock"
    with watching(sock, pid) as quiet:
        time.sleep(5)
    base_tcp = tcp_sockets(pid)
    base_rss, base_fds = quiet.rss_mib[-1], quiet.fds[-1]
    table.add(
        "no flood: `GET /v1/jobs` over the Unix socket",
        f"p50 {percentile(quiet.times_ms, 50):.1f} ms, p99 {percentile(quiet.times_ms, 99):.1f} "
        f"ms; RSS {base_rss:.0f} MiB, {base_fds} open files",
        "",
        not quiet.failures,
    )
    _raise_open_files(20_000 // PROCESSES)
    for name, modes, sources in _phases():
        with watching(sock, pid, port) as watch:
            done = flood(user, port, modes, sources, args.seconds, args.nice)
        phase(table, name, watch, done, base_rss)
    with watching(sock, pid) as watch:
        heads(table, port, watch, base_rss)
    waited = time.monotonic()
    while (tcp := tcp_sockets(pid)) > base_tcp and time.monotonic() - waited < 30:
        time.sleep(0.5)
    table.add(
        "after the floods",
        f"{tcp} TCP sockets open (before: {base_tcp}) {time.monotonic() - waited:.1f} s after "
        f"the last head; {watch.fds[-1]} files in all (before: {base_fds}); RSS "
        f"{watch.rss_mib[-1]:.0f} MiB",
        "TCP sockets back to before within 30 s",
        tcp <= base_tcp,
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30, help="each flood's length")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="the outsider's niceness (19: what the daemon does, apart from the CPU the "
        "outsider takes from every process on a small machine)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the outsider is a new Unix user")
    root = Path(tempfile.mkdtemp(prefix="gpupool-flood-"))
    (root / "token").write_text(TOKEN + "\n")
    (root / "token").chmod(0o600)
    port = _free_port()
    user = create_user("gpf")
    listen = ("--listen", f"127.0.0.1:{port}", "--token-file", str(root / "token"))
    try:
        daemon = start_daemon(root, "1xA30", *listen)
        began = time.monotonic()
        try:
            table = run(root, user, port, daemon.pid, args)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    finally:
        remove_user(user)
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"gpupool listener flood on a simulated 1xA30; {machine_load()}; "
        f"{time.monotonic() - began:.0f} s in all\n"
    )
    print("| case | measured | target | verdict |\n|---|---|---|---|")
    print("\n".join(table.rows))
    sys.exit(1 if table.missed else 0)


if __name__ == "__main__":
    main()
