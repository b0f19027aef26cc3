"""The router's cases for bench/security.py: a service of alice's behind `gpupool serve
--router`, attacked by carol, who needs no account in the pool (the router is a TCP port any
local process may reach): bodies trickled to hold its replica slots, requests smuggled past the
router to a replica on Python's http.server, slow requests sent and reset to hold its replica
slots, its replica's port bound once the replica died.

Run alone (as root) it prints only these rows: `python bench/security_router.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from security_support import SPEC, Bench, attempt, setup, table  # noqa: E402
from tests.agent.conftest import _kill_jobs  # noqa: E402
from tests.agent.daemon_support import Daemon, until  # noqa: E402
from tests.agent.services_support import MODEL_SERVER, free_port  # noqa: E402
from tests.agent.test_router_framing import PLAIN  # noqa: E402
from tests.agent.test_router_takeover import SQUATTER  # noqa: E402
from tests.users import User, gpupool_as, user_env  # noqa: E402

#: carol's attacks, run as carol: ARGV [port, what]; prints a JSON list of what came back
_ATTACK = """
import json, socket, struct, sys, time
from tests.agent.router_attacks import raw, status_of, trickle
from tests.agent.test_router_framing import smuggling
port, what = int(sys.argv[1]), sys.argv[2]
if what == "trickle":
    head = b"POST /alice-chat/x HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 1000\\r\\n\\r\\n"
    held = [trickle(port, head) for _ in range(8)]
    print("holding", flush=True)
    time.sleep(20)
elif what == "reset":  # each held 30 s by the replica, then reset: the client is gone
    for _ in range(8):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /alice-slow/infer?delay=30 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        time.sleep(0.2)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    print("reset", flush=True)
else:
    print(json.dumps([status_of(raw(port, attack)) for attack in smuggling(b"alice-chat")]))
"""


def _as_carol(b: Bench, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _ATTACK, *args],
        user=b.carol.uid,
        group=b.carol.gid,
        env=user_env(b.carol, {"PYTHONPATH": f"{REPO / 'src'}:{REPO}"}),
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    b.processes.append(process)
    return process


def _routed_service(b: Bench, owner: User) -> tuple[Daemon, str]:
    """A daemon of the socket group with a router; `owner`'s service on http.server in it."""
    root = b.root / "routed"
    root.mkdir(mode=0o755)
    daemon = Daemon(root, SPEC, ("--socket-group", b.group, "--router", f"127.0.0.1:{free_port()}"))
    daemon.start()
    argv = ["--memory", "1Gi", "--compute", "10", "--concurrency", "2", "--workdir", "/tmp"]
    argv += ["--", sys.executable, PLAIN, "HTTP/1.0"]  # a connection per request
    done = gpupool_as(owner, "service", "create", "alice-chat", *argv, url=daemon.url)
    if done.returncode != 0:
        raise RuntimeError(f"service create: {done.stderr.strip()}")
    ready = lambda: daemon.call("GET", "/v1/services/alice-chat")["replicas"]["ready"]  # noqa: E731
    if not until(ready, timeout=60):
        raise RuntimeError("alice's service did not become ready")
    return daemon, daemon.extra[-1]


def case_router(b: Bench) -> None:
    daemon, where = _routed_service(b, b.alice)
    port, url = int(where.rsplit(":", 1)[1]), f"http://{where}/alice-chat"
    try:
        _trickled(b, daemon, port, url)
        _smuggled(b, port, url)
        _reset(b, daemon, port, where)
        _taken_over(b, daemon, url)
    finally:
        daemon.stop()
        _kill_jobs(daemon)  # the router process, which outlives the daemon, and the replicas


def _trickled(b: Bench, daemon: Daemon, port: int, url: str) -> None:
    holder = _as_carol(b, str(port), "trickle")
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    began = time.monotonic()
    answer = httpx.get(f"{url}/mine", timeout=90)
    took = time.monotonic() - began
    slots = daemon.call("GET", "/v1/services/alice-chat")["in_flight"]
    holder.kill()
    b.record(
        "router: trickled bodies",
        "carol (no account needed)",
        "8 connections to alice's service (concurrency 2), each a head and 1 byte of a "
        "1,000-byte body, held 20 s; then alice's request",
        f"alice: {answer.status_code} in {took:.2f} s; replica slots held meanwhile: {slots}",
        answer.status_code == 200 and took < 5 and slots == 0,
    )


def _smuggled(b: Bench, port: int, url: str) -> None:
    attacker = _as_carol(b, str(port), "smuggle")
    statuses, _ = attacker.communicate(timeout=60)
    after = [httpx.get(f"{url}/mine-{n}", timeout=30) for n in range(3)]
    hers = [a.status_code == 200 and a.json()["path"] == f"/mine-{n}" for n, a in enumerate(after)]
    b.record(
        "router: smuggling",
        "carol",
        "a request hidden in a chunked body, in a chunked body's trailers, in a GET's "
        "Content-Length body (replica: Python's http.server, HTTP/1.0); then alice's requests",
        f"carol's answers {json.loads(statuses)}; alice's next 3 requests: "
        f"{[a.status_code for a in after]}, each her own answer: {all(hers)}",
        all(hers),
    )


def _reset(b: Bench, daemon: Daemon, port: int, where: str) -> None:
    argv = ["--memory", "1Gi", "--compute", "10", "--concurrency", "2", "--workdir", "/tmp"]
    argv += ["--", sys.executable, MODEL_SERVER, "--memory-mib", "64"]  # /infer?delay=S
    created = gpupool_as(b.alice, "service", "create", "alice-slow", *argv, url=daemon.url)
    ready = lambda: daemon.call("GET", "/v1/services/alice-slow")["replicas"]["ready"]  # noqa: E731
    if created.returncode != 0 or not until(ready, timeout=60):
        raise RuntimeError(f"alice-slow did not become ready: {created.stderr.strip()}")
    attacker = _as_carol(b, str(port), "reset")
    assert attacker.stdout is not None and attacker.stdout.readline() == "reset\n"
    began = time.monotonic()
    answer = httpx.get(f"http://{where}/alice-slow/infer", timeout=90)
    took = time.monotonic() - began
    b.record(
        "router: requests reset",
        "carol",
        "8 requests to alice's service (concurrency 2) that its replica holds 30 s "
        "(`/infer?delay=30`), each reset 0.2 s after it was sent; then alice's request",
        f"alice: {answer.status_code} in {took:.2f} s",
        answer.status_code == 200 and took < 5,
    )


def _taken_over(b: Bench, daemon: Daemon, url: str) -> None:
    service = daemon.call("GET", "/v1/services/alice-chat")
    replica = service["replica_list"][0]
    squatter = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, str(replica["port"]), "8"],
        user=b.carol.uid,
        group=b.carol.gid,
        env=user_env(b.carol),
        stdout=subprocess.PIPE,
        text=True,
    )
    b.processes.append(squatter)
    os.kill(httpx.get(f"{url}/pid").json()["pid"], signal.SIGKILL)
    assert squatter.stdout is not None and squatter.stdout.readline() == "bound\n"
    token = {"Authorization": "Bearer alice-s3cret"}
    answers = [httpx.get(f"{url}/mine", headers=token, timeout=90) for _ in range(20)]
    squatter.kill()
    heard, _ = squatter.communicate(timeout=10)
    codes = sorted({a.status_code for a in answers})
    b.record(
        "router: port takeover",
        "carol",
        "binds alice's replica's port the moment the replica dies (root kills it with -9); "
        "alice sends 20 requests with an Authorization header",
        f"carol received {len(heard)} bytes; alice's answers: {codes}, "
        f"from carol: {sum(a.text == 'squatter' for a in answers)}",
        heard == "" and all(a.text != "squatter" for a in answers),
    )


def main() -> int:
    if os.geteuid() != 0:
        print("bench/security_router.py makes Unix users: run it as root", file=sys.stderr)
        return 2
    with setup() as (people, root):
        no_daemon = Daemon(root / "unused", SPEC)  # these cases start the daemon they need
        b = Bench(root, people.alice, people.bob, people.carol, people.group, no_daemon, 0)
        attempt(b, case_router)
        for process in b.processes:
            if process.poll() is None:
                process.kill()
    print(table(b))
    return 0 if all(row.contained for row in b.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
