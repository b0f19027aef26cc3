"""Two users' services on one root daemon: each runs as its owner, only its owner (or an admin)
changes it, and others see its share and traffic but not its command."""

from __future__ import annotations

import json
import os
import sys

import httpx
import pytest
from tests.agent.daemon_support import until
from tests.agent.multiuser_support import group_daemon
from tests.agent.services_support import MODEL_SERVER, free_port
from tests.users import gpupool_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")


def test_two_users_services_run_as_their_owners_and_only_they_change_them() -> None:
    port = free_port()
    with group_daemon("2xA100-40GB", extra=("--router", f"127.0.0.1:{port}")) as (daemon, users):
        alice, bob = users
        for user, name in ((alice, "alice-chat"), (bob, "bob-embed")):
            done = gpupool_as(
                user,
                "service",
                "create",
                name,
                "--memory",
                "2Gi",
                "--compute",
                "20",
                "--workdir",
                "/tmp",
                "--",
                sys.executable,
                MODEL_SERVER,
                "--memory-mib",
                "128",
                url=daemon.url,
            )
            assert done.returncode == 0, done.stderr

        def both_ready() -> bool:
            listed = daemon.call("GET", "/v1/services")["services"]
            return len(listed) == 2 and all(s["replicas"]["ready"] == 1 for s in listed)

        assert until(both_ready, timeout=40), daemon.call("GET", "/v1/services")
        for name, user in (("alice-chat", alice), ("bob-embed", bob)):
            answer = httpx.get(f"http://127.0.0.1:{port}/{name}/infer", timeout=30)
            assert answer.status_code == 200
            job = daemon.call("GET", "/v1/services/" + name)["replica_list"][0]["job_id"]
            assert daemon.job(job)["user"] == user.name  # the replica runs as its owner
        listed = json.loads(gpupool_as(bob, "service", "ls", "--json", url=daemon.url).stdout)
        assert {s["name"]: s["user"] for s in listed["services"]} == {
            "alice-chat": alice.name,
            "bob-embed": bob.name,
        }
        seen = json.loads(
            gpupool_as(bob, "service", "describe", "alice-chat", "--json", url=daemon.url).stdout
        )
        assert seen["spec"]["argv"] is None and seen["spec"]["env"] is None
        for args in (("delete", "alice-chat"), ("scale", "alice-chat", "0..3")):
            refused = gpupool_as(bob, "service", *args, url=daemon.url)
            assert refused.returncode == 6 and "belongs to" in refused.stderr, refused
        logs = gpupool_as(bob, "service", "logs", "alice-chat", url=daemon.url)
        assert logs.returncode == 6, logs
        assert daemon.call("GET", "/v1/services/alice-chat")["replicas"]["max"] == 1
        mine = gpupool_as(alice, "service", "delete", "alice-chat", url=daemon.url)
        assert mine.returncode == 0, mine.stderr
