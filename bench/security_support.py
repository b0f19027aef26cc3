"""What bench/security.py needs besides its cases: the people (real Unix users), the shared
daemon, a request or a command made as one of them, and the table of what was seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tests.agent.daemon_support import Daemon, cli
from tests.users import (
    User,
    add_to_group,
    check_interpreter,
    create_group,
    gpupool_as,
    remove_group,
    remove_tree,
    run_as,
    user_env,
    users,
    world_dir,
)

#: the checkout (its path is left out of what is printed)
REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
GiB = 1 << 30
SPEC = "1xA100-40GB"
LOG_CAP = "64Mi"
TOKEN = "b6c1e0f2d8a4973e5f0c2a1b7d9e8f60"
#: the exemption (by path) of the shared daemon; case 16's impostor calls itself by it
XORG = "/usr/lib/xorg/Xorg"
#: a request over the Unix socket as the user who runs it, `repeat` times on one connection:
#: the body comes on stdin (so it may be larger than a command line), sent in 1 MiB pieces with
#: no length when asked; each answer is timed in the requesting process, its start left out
_REQUEST = """
import json, sys, time, httpx
sock, method, path, headers, chunked, repeat = json.loads(sys.argv[1])
data = sys.stdin.buffer.read() or None
transport = httpx.HTTPTransport(uds=sock)
took = []
with httpx.Client(transport=transport, base_url="http://gpupool", timeout=60) as client:
    for _ in range(repeat):
        body = data
        if data is not None and chunked:
            body = iter([data[at : at + (1 << 20)] for at in range(0, len(data), 1 << 20)])
        began = time.monotonic()
        answer = client.request(method, path, content=body, headers=headers)
        answer.read()
        took.append(time.monotonic() - began)
print(json.dumps([answer.status_code, dict(answer.headers), answer.text[:4000], took]))
"""


@dataclass
class Row:
    case: str
    who: str
    tried: str
    happened: str
    contained: bool


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str
    #: the time of each request (one unless repeated)
    times: list[float]

    @property
    def seconds(self) -> float:
        return self.times[0]

    @property
    def message(self) -> str:
        try:
            data = json.loads(self.text)
        except ValueError:
            return self.text[:120]
        return str(data.get("message", data)) if isinstance(data, dict) else str(data)[:120]

    def __str__(self) -> str:
        return f"{self.status} {self.message}"


@dataclass
class Bench:
    """The people, the shared daemon, and what was seen."""

    root: Path
    alice: User
    bob: User
    carol: User
    group: str
    daemon: Daemon
    port: int
    rows: list[Row] = field(default_factory=list)
    #: other directories made under /tmp, removed at the end
    dirs: list[Path] = field(default_factory=list)
    #: processes started besides the daemons' jobs, ended at the end
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)
    #: alice's long job (cases 1, 5, 6, 14, 15)
    job: int = 0
    figures: dict[str, str] = field(default_factory=dict)

    @property
    def sock(self) -> Path:
        return self.daemon.state_dir / "gpupool.sock"

    @property
    def state(self) -> Path:
        return self.daemon.state_dir

    def fresh(self, name: str) -> list[str]:
        """`serve`'s options for a new simulated node and state dir of their own, `name`d."""
        node, state = self.root / f"node-{name}", self.root / f"state-{name}"
        return ["--simulate", "1xA30", "--node-dir", str(node), "--state-dir", str(state)]

    def jobdir(self, job: int) -> Path:
        return self.state / "jobs" / str(job)

    def names(self, user: User | None) -> str:
        return "root" if user is None else {self.alice: "alice", self.bob: "bob"}.get(user, "carol")

    def clean(self, text: str) -> str:
        """`text` without this machine's paths or the users' random names, fit for a cell."""
        for path in sorted([self.root, *self.dirs], key=lambda p: -len(str(p))):
            text = text.replace(str(path), "...")
        for user in (self.alice, self.bob, self.carol):
            text = text.replace(user.name, self.names(user))
        text = text.replace(self.group, "GROUP").replace(str(REPO), ".")
        text = " ".join(text.split())
        return text if len(text) <= 400 else text[:397] + "..."

    def record(self, case: str, who: str, tried: str, happened: str, contained: bool) -> None:
        self.rows.append(Row(case, who, tried, self.clean(happened), contained))

    def gpupool(self, user: User | None, *args: str) -> subprocess.CompletedProcess[str]:
        """`gpupool ARGS` against the shared daemon, run by `user` (None: root)."""
        if user is None:
            return cli(*args, url=self.daemon.url)
        return gpupool_as(user, *args, url=self.daemon.url)

    def request(
        self,
        user: User,
        method: str,
        path: str,
        body: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        sock: Path | None = None,
        chunked: bool = False,
        repeat: int = 1,
    ) -> Answer:
        """An HTTP request over a Unix socket (the shared daemon's by default) by `user`, made
        `repeat` times; the last answer."""
        where = str(sock or self.sock)
        sent = {"Content-Type": "application/json"} if body is not None else {}
        sent.update(headers or {})
        done = run_as(
            user,
            [
                sys.executable,
                "-c",
                _REQUEST,
                json.dumps([where, method, path, sent, chunked, repeat]),
            ],
            input=body or "",
            timeout=120,
        )
        if done.returncode != 0:
            return Answer(-1, {}, last_line(done.stderr), [0.0])
        status, answer_headers, text, took = json.loads(done.stdout)
        return Answer(int(status), answer_headers, text, [float(t) for t in took])

    def local(self) -> httpx.Client:
        """root's client over the shared daemon's socket, in this process (for timings)."""
        transport = httpx.HTTPTransport(uds=str(self.sock))
        return httpx.Client(transport=transport, base_url="http://gpupool", timeout=30)

    def submit(self, user: User, *argv: str, share: tuple[str, ...] = ("--compute", "10")) -> int:
        done = self.gpupool(user, "submit", *share, "--", *argv)
        if done.returncode != 0:
            raise RuntimeError(f"submit failed: {said(done)}")
        return int(done.stdout.strip())

    def job_ids(self) -> list[int]:
        return [
            job["id"] for job in self.daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]
        ]


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def said(done: subprocess.CompletedProcess[str]) -> str:
    """A command's exit status and what it said on stderr (its last line)."""
    lines = done.stderr.strip().splitlines()
    count = f" ({len(lines)} lines)" if len(lines) > 1 else ""
    return f"exit {done.returncode}{count}: {last_line(done.stderr) or done.stdout.strip()[:80]}"


def refused_line(done: subprocess.CompletedProcess[str], code: int | None = None) -> bool:
    """The command failed (with `code` when given) saying one line."""
    failed = done.returncode != 0 if code is None else done.returncode == code
    return failed and done.stderr.count("\n") == 1


def serve_once(*args: str, user: User | None = None, wait: float = 60) -> tuple[int | None, str]:
    """`gpupool serve ARGS` expected to refuse: its exit status and stderr, or None when it was
    still running after `wait` s (then it is stopped)."""
    env = (
        user_env(user)
        if user is not None
        else {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    )
    ids = {} if user is None else {"user": user.uid, "group": user.gid}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "serve", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **ids,  # type: ignore[call-overload]
    )
    try:
        _, err = process.communicate(timeout=wait)
        return process.returncode, err
    except subprocess.TimeoutExpired:
        process.terminate()
        _, err = process.communicate(timeout=30)
        return None, err


def attempt(b: Bench, case: Callable[[Bench], None]) -> None:
    """Run one case; one that breaks down is a row NOT contained, and the rest go on."""
    try:
        case(b)
    except Exception as err:  # reported as a finding, never hidden
        label = case.__name__.removeprefix("case_").replace("_", " ")
        b.record(label, "-", "the case itself", f"broke down: {type(err).__name__}: {err}", False)


def table(b: Bench) -> str:
    lines = [
        "| case | tried as | what was tried | what happened | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in b.rows:
        verdict = "contained" if row.contained else "**NOT contained**"
        cells = [row.case, row.who, row.tried, row.happened, verdict]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def main_daemon(root: Path, group: str, port: int) -> Daemon:
    token = root / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    extra = (
        "--socket-group",
        group,
        "--max-log-size",
        LOG_CAP,
        "--listen",
        f"127.0.0.1:{port}",
        "--token-file",
        str(token),
        "--watchdog",
        "kill",
        "--watchdog-exempt",
        XORG,
    )
    return Daemon(root, SPEC, extra).start()


@dataclass
class People:
    alice: User
    bob: User
    carol: User
    group: str


@contextmanager
def setup() -> Iterator[tuple[People, Path]]:
    """alice and bob in a fresh socket group, carol outside it, a directory every user may
    enter; all of them removed afterwards."""
    root = world_dir()
    group = create_group()
    try:
        with users(3) as (alice, bob, carol):
            for user in (alice, bob):
                add_to_group(user, group)
            check_interpreter(alice)
            yield People(alice, bob, carol, group), root
    finally:
        remove_group(group)
        remove_tree(root)
