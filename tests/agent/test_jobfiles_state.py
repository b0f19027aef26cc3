"""The state dir, the database and the job files refuse what another user could plant: links,
FIFOs, directories others can write (real users own what they plant here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.users import User, remove_tree, users, world_dir

from gpupool.agent import statedir
from gpupool.agent.jobdir import JobDir
from gpupool.agent.store import Store
from gpupool.core.errors import ConfigError
from gpupool.isolation.region import OpenRegions


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory every user may enter, root's (0755)."""
    path = world_dir()
    yield path
    remove_tree(path)


@pytest.fixture
def alice() -> Iterator[User]:
    with users(1) as made:
        yield made[0]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        statedir.prepare(path)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_new_state_dir_is_0700_and_a_socket_groups_0750_is_kept(world: Path) -> None:
    made = statedir.prepare(world / "a" / "state")
    assert made == world / "a" / "state" and _mode(made) == 0o700
    assert _mode(world / "a") == 0o755  # a missing parent is made as mkdir -p makes it
    shared = world / "shared"
    shared.mkdir(mode=0o750)
    os.chown(shared, 0, 100)  # root:GROUP, group read and search: the socket group's layout
    assert statedir.prepare(shared) == shared and _mode(shared) == 0o750


def test_a_state_dir_of_another_user_is_refused(world: Path, alice: User) -> None:
    theirs = world / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, alice.uid, alice.gid)
    says = _refused(theirs)
    assert f"belongs to uid {alice.uid}, not to this daemon's user (uid 0)" in says


@pytest.mark.parametrize(("mode", "who"), [(0o770, "its group"), (0o703, "others")])
def test_a_state_dir_others_can_write_is_refused(world: Path, mode: int, who: str) -> None:
    state = world / "state"
    state.mkdir()
    state.chmod(mode)
    says = _refused(state)
    assert f"is writable by {who} (mode 0{mode:o}): chmod go-w {state}" in says


def test_a_state_dir_reached_through_a_link_is_refused(world: Path) -> None:
    (world / "real" / "state").mkdir(parents=True)
    (world / "link").symlink_to(world / "real")
    (world / "state-link").symlink_to(world / "real" / "state")
    assert _refused(world / "link" / "state").startswith(f"{world / 'link'} is a symbolic link")
    assert _refused(world / "state-link").startswith(f"{world / 'state-link'} is a symbolic link")


def test_a_parent_another_user_controls_is_refused(world: Path, alice: User) -> None:
    theirs = world / "theirs"
    theirs.mkdir()
    os.chown(theirs, alice.uid, alice.gid)
    assert "belongs to uid" in _refused(theirs / "state")
    (world / "open").mkdir()
    (world / "open").chmod(0o777)
    assert "who could replace the state dir" in _refused(world / "open" / "state")
    (world / "sticky").mkdir()
    (world / "sticky").chmod(0o1777)  # as /tmp: nobody can replace what is ours in there
    assert statedir.prepare(world / "sticky" / "state") == world / "sticky" / "state"
    assert not (world / "theirs" / "state").exists()


def test_serve_refuses_a_linked_state_dir_in_one_line(world: Path) -> None:
    (world / "real").mkdir(mode=0o700)
    (world / "state").symlink_to(world / "real")
    served = subprocess.run(
        [sys.executable, "-m", "gpupool", "serve", "--state-dir", str(world / "state")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode != 0
    assert served.stderr.count("\n") == 1 and "is a symbolic link" in served.stderr
    assert list((world / "real").iterdir()) == []


def test_a_planted_jobs_link_is_refused_and_its_target_untouched(world: Path) -> None:
    from gpupool.agent.jobdir import jobs_dir

    state = statedir.prepare(world / "state")
    target = world / "elsewhere"
    target.mkdir(mode=0o700)
    (state / "jobs").symlink_to(target)
    with pytest.raises(ConfigError, match="jobs is a symbolic link"):
        jobs_dir(state)
    assert _mode(target) == 0o700 and list(target.iterdir()) == []


def test_the_database_and_its_wal_are_0600_and_never_a_link(world: Path) -> None:
    state = statedir.prepare(world / "state")
    store = Store(state / "state.db")
    store.set_setting("draining", "0")
    assert _mode(state / "state.db") == 0o600
    assert _mode(state / "state.db-wal") == 0o600 and _mode(state / "state.db-shm") == 0o600
    store.close()
    (state / "state.db").chmod(0o644)  # as an older gpupool left it
    Store(state / "state.db").close()
    assert _mode(state / "state.db") == 0o600
    secret = world / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    other = statedir.prepare(world / "other")
    (other / "state.db").symlink_to(secret)
    with pytest.raises(ConfigError, match="state database"):
        Store(other / "state.db")
    assert secret.read_bytes() == b"root only"


def test_a_log_that_is_a_fifo_or_a_link_reads_as_nothing_at_once(tmp_path: Path) -> None:
    jobdir = JobDir(tmp_path / "1")
    jobdir.create()
    assert _mode(jobdir.path) == 0o711
    assert jobdir.read_log("stdout", 0, 100) == b""  # none yet
    os.mkfifo(jobdir.stdout)  # a writer that never comes would block a plain open
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only")
    jobdir.stderr.symlink_to(secret)
    began = time.monotonic()
    assert jobdir.read_log("stdout", 0, 100) == b""
    assert jobdir.read_log("stderr", 0, 100) == b""
    assert time.monotonic() - began < 1
    jobdir.stdout.unlink()
    jobdir.stdout.write_bytes(b"0123456789")
    assert jobdir.read_log("stdout", 3, 4) == b"3456"
    assert jobdir.read_log("stdout", 20, 4) == b""


def test_the_launch_file_is_0600(tmp_path: Path) -> None:
    jobdir = JobDir(tmp_path / "1")
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "launch.json.tmp").symlink_to(tmp_path / "elsewhere")
    jobdir.write_launch({"env": {"TOKEN": "secret"}})
    assert _mode(jobdir.path / "launch.json") == 0o600 and _mode(jobdir.path) == 0o711
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("planted", ["fifo", "link", "theirs"])
def test_a_region_that_is_no_regular_file_of_its_share_is_refused_at_once(
    tmp_path: Path, alice: User, planted: str
) -> None:
    share = tmp_path / "gpupool-share-x"
    share.mkdir(mode=0o700)
    os.chown(share, alice.uid, alice.gid)
    region = share / "region"
    if planted == "fifo":
        os.mkfifo(region)
    elif planted == "link":
        region.symlink_to(tmp_path / "elsewhere")
    else:
        region.write_bytes(b"\0" * 4096)  # root's, in alice's directory
    if planted != "theirs":
        os.lchown(region, alice.uid, alice.gid)
    regions = OpenRegions()
    began = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        regions.read(region)
    assert time.monotonic() - began < 1 and "\n" not in str(refused.value)
    assert str(region) in str(refused.value)
