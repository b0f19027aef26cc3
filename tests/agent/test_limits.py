"""Bounded, valid submissions: JobSpec's limits, over the daemon's socket too, and a stored spec
from an older gpupool that no longer reads (listed as a placeholder, failed by the queue)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.agent.daemon_support import Daemon, scrape, until

from gpupool.agent import jobs as limits
from gpupool.agent.jobs import JobSpec
from gpupool.core.errors import InvalidRequest


def raw(daemon: Daemon, method: str, path: str, body: Any = None) -> httpx.Response:
    """One request over the daemon's socket, its answer as sent (no error mapping)."""
    transport = httpx.HTTPTransport(uds=str(daemon.state_dir / "gpupool.sock"))
    with httpx.Client(transport=transport, base_url="http://gpupool", timeout=30) as client:
        if body is None:
            return client.request(method, path)
        # JSON as a client may send it: `\ud800` is a valid JSON escape, no valid text
        content = json.dumps(body).encode()
        return client.request(
            method, path, content=content, headers={"content-type": "application/json"}
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "\ud800"}, "name is not valid UTF-8"),
        ({"name": "x" * (limits.MAX_NAME_CHARS + 1)}, "at most 128 printable"),
        ({"name": "a\x1b[2Jb"}, "printable"),
        ({"argv": ("true", "\udcff")}, r"argv\[1\] is not valid UTF-8"),
        ({"argv": ("true", "a\0b")}, r"argv\[1\] holds a NUL"),
        ({"argv": ("true",) * (limits.MAX_ARGS + 1)}, "too many arguments"),
        ({"argv": ("true", "x" * limits.MAX_ARGV_BYTES)}, "the command is"),
        ({"env": {"A=B": "1"}}, "invalid environment variable name"),
        ({"env": {"1A": "1"}}, "invalid environment variable name"),
        ({"env": {"": "1"}}, "invalid environment variable name"),
        ({"env": {"\ud800": "1"}}, "an environment variable name is not valid UTF-8"),
        ({"env": {"A": "\ud800"}}, r"env\[A\] is not valid UTF-8"),
        ({"env": {f"V{i}": "" for i in range(limits.MAX_ENV_VARS + 1)}}, "too many environment"),
        ({"env": {"A": "x" * limits.MAX_ENV_BYTES}}, "the environment is"),
        ({"workdir": "relative"}, "an absolute path"),
        ({"workdir": "/" + "d" * limits.MAX_WORKDIR_BYTES}, "an absolute path"),
        ({"workdir": "/\ud800"}, "workdir is not valid UTF-8"),
        ({"gpu_models": ("A100",) * (limits.MAX_GPU_MODELS + 1)}, "too many GPU models"),
        ({"gpu_models": ("A" * 65,)}, r"gpu_models\[0\]"),
        ({"memory": "\ud800"}, "memory is not valid UTF-8"),
    ],
)
def test_a_spec_out_of_bounds_is_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as caught:
        JobSpec(**{"argv": ("true",), **fields})
    line = str(caught.value)
    assert "\n" not in line and len(line) < 200
    line.encode()  # the line itself is sendable


def test_a_spec_at_the_bounds_is_accepted() -> None:
    argv = ("x" * (limits.MAX_ARGV_BYTES // limits.MAX_ARGS - 1),) * limits.MAX_ARGS
    env = {f"V{i:03}": "" for i in range(limits.MAX_ENV_VARS)}
    spec = JobSpec(
        argv=argv,
        name="n" * limits.MAX_NAME_CHARS,
        env=env,
        workdir="/" + "d" * (limits.MAX_WORKDIR_BYTES - 2),
        gpu_models=("A100",) * limits.MAX_GPU_MODELS,
    )
    assert len(spec.argv) == limits.MAX_ARGS
    JobSpec(("true",), name="ünïcode — 名前", env={"_lower_1": "é"})


def test_a_lone_surrogate_name_is_refused_and_listing_still_works(daemon: Daemon) -> None:
    answer = raw(daemon, "POST", "/v1/jobs", {"argv": ["true"], "workdir": "/", "name": "\ud800"})
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "InvalidRequest",
        "message": "name is not valid UTF-8 text (a lone surrogate at character 0)",
    }
    assert daemon.call("GET", "/v1/jobs", params={"all": True}) == {"jobs": []}
    for path in ("/v1/jobs?all=true", "/metrics", "/v1/dashboard"):
        assert raw(daemon, "GET", path).status_code == 200, path


def test_names_env_and_argv_past_their_bounds_get_400_and_store_nothing(daemon: Daemon) -> None:
    base = {"argv": ["true"], "workdir": "/"}
    for extra, word in (
        ({"name": "n" * 200}, "name"),
        ({"env": {"A=B": "1"}}, "environment variable name"),
        ({"env": {f"V{i}": "1" for i in range(300)}}, "too many environment variables"),
        ({"argv": ["true"] * 2000}, "too many arguments"),
        ({"argv": ["true", "\ud800"]}, "argv[1]"),
    ):
        answer = raw(daemon, "POST", "/v1/jobs", {**base, **extra})
        assert answer.status_code == 400, extra
        assert answer.json()["error"] == "InvalidRequest"
        assert word in answer.json()["message"]
    # a 2 MB name: refused by the body limit (413) where there is one, else by the name's
    answer = raw(daemon, "POST", "/v1/jobs", {**base, "name": "n" * 2_000_000})
    assert answer.status_code in (400, 413)
    assert daemon.call("GET", "/v1/jobs", params={"all": True}) == {"jobs": []}


def test_a_burst_no_memory_could_back_is_refused_at_submit(daemon: Daemon) -> None:
    # 2x A100-40GB: 80 GiB of GPU memory, and the host's own
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = host + sum(gpu["memory_total"] for gpu in daemon.call("GET", "/v1/node")["gpus"])
    low = {"argv": ["true"], "workdir": "/", "memory": "1Gi", "priority": "low"}
    for burst in ("1e30", "1000000Ti", f"{room + 1}"):
        answer = raw(daemon, "POST", "/v1/jobs", {**low, "memory_burst": burst})
        assert answer.status_code == 400, (burst, answer.text)
        message = answer.json()["message"]
        assert message.startswith(f"invalid --memory-burst {burst!r}: "), message
        assert "more than this node's host and GPU memory together" in message
    two = raw(daemon, "POST", "/v1/jobs", {**low, "gpus": 2, "memory_burst": f"{room // 2 + 1}"})
    assert two.status_code == 400, two.text  # per GPU: twice the burst in all
    assert daemon.call("GET", "/v1/jobs", params={"all": True}) == {"jobs": []}
    # at the bound, a burst is taken (and runs)
    fits = daemon.submit(["true"], memory="1Gi", priority="low", memory_burst=str(room))
    assert daemon.wait(fits)["state"] == "succeeded"


def test_a_stored_spec_that_no_longer_reads_is_listed_as_a_placeholder_and_failed(
    daemon: Daemon,
) -> None:
    good = daemon.submit(["true"], name="good")
    daemon.wait(good)
    # a row as an older gpupool stored it: its JSON escapes a lone surrogate in the name
    spec = JobSpec(("true",)).to_json() | {"name": "\ud800"}
    db = sqlite3.connect(daemon.state_dir / "state.db", timeout=10)
    with db:
        db.execute(
            "INSERT INTO jobs (spec, uid, user, state, rank, submitted_at) "
            "VALUES (?, 0, 'root', 'queued', 0, ?)",
            (json.dumps(spec), time.time()),
        )
    db.close()
    listed = until(
        lambda: [
            job
            for job in daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]
            if job["state"] == "failed"
        ]
    )
    assert [job["name"] for job in listed] == ["(unreadable)"]
    assert "its stored spec cannot be read" in listed[0]["unreadable"]
    described = daemon.job(listed[0]["id"])
    assert described["events"][-1]["kind"] == "failed"
    assert "its stored spec cannot be read" in described["events"][-1]["detail"]
    for path in ("/v1/jobs?all=true", "/metrics", "/v1/dashboard"):
        assert raw(daemon, "GET", path).status_code == 200, path
    assert "gpupool_jobs" in " ".join(scrape(daemon))
    later = daemon.submit(["true"], name="later")  # the queue goes on
    assert daemon.wait(later)["state"] == "succeeded"


def test_a_damaged_stored_spec_reads_as_a_placeholder(tmp_path: Path) -> None:
    from gpupool.agent.store import Store

    store = Store(tmp_path / "state.db")
    store.add(JobSpec(("true",), name="fine"), 0, "root")
    with store.transaction() as db:
        db.execute(
            "INSERT INTO jobs (spec, uid, user, state, rank, submitted_at) "
            "VALUES ('{not json', 0, 'root', 'succeeded', 0, 1)"
        )
    fine, damaged = store.jobs()
    assert fine.unreadable is None and fine.name == "fine"
    assert damaged.name == "(unreadable)"
    assert damaged.unreadable is not None and "JSONDecodeError" in damaged.unreadable
    json.dumps(damaged.to_json()).encode()
