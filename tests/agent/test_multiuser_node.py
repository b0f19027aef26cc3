"""A root daemon's simulated node, as its socket group's users meet it (issue 35, smaller ones):
their jobs reach the default node (not a 0700 directory of root's), they may look at it with
`gpupool gpus` (without root's node.lock), and they cannot change it beyond the state file every
process on the simulated driver writes."""

from __future__ import annotations

import os
import stat

import pytest
from tests.agent.daemon_support import CUDA_JOB
from tests.agent.multiuser_support import group_daemon
from tests.users import gpupool_as, remove_tree, run_as, world_dir

from gpupool.devices.sim.spec import parse_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")


def test_a_users_job_runs_on_a_root_daemons_default_node() -> None:
    runtime = world_dir()  # root's runtime dir, as /tmp is for a daemon without one
    try:
        env = {"XDG_RUNTIME_DIR": str(runtime)}
        with group_daemon("1xA30", 1, env=env, default_node=True) as (daemon, (alice,)):
            job = ["--memory", "1Gi", "--compute", "10", "--", "python3", CUDA_JOB, "0.2", "64"]
            done = gpupool_as(alice, "submit", "--wait", *job, url=daemon.url)
            assert done.returncode == 0, (done.stdout, done.stderr)
            base = runtime / "gpupool-sim"
            assert stat.S_IMODE(base.stat().st_mode) == 0o711
            node = base / parse_spec("1xA30").key
            # nobody but root may list the node directories or add to them
            listed = run_as(alice, ["ls", str(base)])
            assert listed.returncode != 0 and "Permission denied" in listed.stderr
            planted = run_as(alice, ["touch", str(node / "planted")])
            assert planted.returncode != 0 and "Permission denied" in planted.stderr
    finally:
        remove_tree(runtime)


def test_a_user_looks_at_a_root_daemons_node_read_only() -> None:
    with group_daemon("1xA30", 1) as (daemon, (alice,)):
        node = daemon.node_dir
        before = {path.name: path.stat().st_mtime_ns for path in node.iterdir()}
        shown = gpupool_as(alice, "gpus", "--node-dir", str(node), url=daemon.url)
        assert shown.returncode == 0, shown.stderr
        assert "A30" in shown.stdout and "node.lock" not in shown.stderr
        as_json = gpupool_as(alice, "gpus", "--json", "--node-dir", str(node), url=daemon.url)
        assert as_json.returncode == 0, as_json.stderr
        # what she may write is the state file alone (as every process on the driver does)
        for name in ("node.json", "node.lock"):
            wrote = run_as(alice, ["sh", "-c", f"echo x >> {node / name}"])
            assert wrote.returncode != 0, name
        after = {path.name: path.stat().st_mtime_ns for path in node.iterdir()}
        assert {k: v for k, v in after.items() if k != "state.bin"} == {
            k: v for k, v in before.items() if k != "state.bin"
        }
