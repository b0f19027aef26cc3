"""Real, distinct Unix users for the multi-user tests: created here (root only), removed after.

A shared server's users are ordinary accounts with no access to root's home, so these tests run
the CLI and jobs as such accounts: `useradd` makes them, `run_as` runs a command with their uid,
gid and groups and a clean environment. They run this checkout's venv, whose interpreter is
Debian's /usr/bin/python3 (`make venv` picks it), so they can start it.

Directories they must reach (a daemon's socket, a node) go under `world_dir()`: pytest's own
tmp_path lives in /tmp/pytest-of-root, which only root may enter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    @property
    def groups(self) -> list[int]:
        return os.getgrouplist(self.name, self.gid)


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the multi-user tests create Unix users: run them as root (CI does)")


def create_user(prefix: str = "gpt") -> User:
    """A new ordinary user with no home and no login shell; `remove_user` deletes it."""
    _require_root()
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
        check=True,
        capture_output=True,
    )
    import pwd

    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)


def remove_user(user: User) -> None:
    subprocess.run(["userdel", user.name], check=False, capture_output=True)
    subprocess.run(["groupdel", user.name], check=False, capture_output=True)


def create_group(prefix: str = "gpg") -> str:
    """A new system group (its name); `remove_group` deletes it."""
    _require_root()
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    return name


def add_to_group(user: User, group: str) -> None:
    subprocess.run(["usermod", "-aG", group, user.name], check=True, capture_output=True)


def remove_group(name: str) -> None:
    subprocess.run(["groupdel", name], check=False, capture_output=True)


@contextmanager
def users(count: int, prefix: str = "gpt") -> Iterator[list[User]]:
    """`count` fresh users, removed on exit."""
    made: list[User] = []
    try:
        for _ in range(count):
            made.append(create_user(prefix))
        yield made
    finally:
        for user in made:
            remove_user(user)


def world_dir() -> Path:
    """A new directory in /tmp that every user may enter (0755, root's); the caller removes it."""
    path = Path(tempfile.mkdtemp(prefix="gpupool-mu-", dir="/tmp"))
    path.chmod(0o755)
    return path


def user_env(user: User, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a login would give `user`, plus this checkout's sources on the path."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "USER": user.name,
        "LOGNAME": user.name,
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(SRC),
    }
    env.update(extra or {})
    return env


def run_as(
    user: User,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: str = "/",
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`argv` run as `user` (uid, gid and groups), in a clean environment, output captured."""
    return subprocess.run(
        list(argv),
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups,
        env=user_env(user, env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def gpupool_as(
    user: User, *args: str, url: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`gpupool ARGS` as `user` runs it, against the daemon at `url`."""
    return run_as(
        user, [sys.executable, "-m", "gpupool", *args], env={"GPUPOOL_URL": url}, timeout=timeout
    )


def check_interpreter(user: User) -> None:
    """Fail with the fix when `user` cannot run this checkout's interpreter and package."""
    done = run_as(user, [sys.executable, "-c", "import gpupool"])
    if done.returncode != 0:
        pytest.fail(
            f"{user.name} cannot run {sys.executable} with gpupool ({done.stderr.strip()}): "
            "build the venv with an interpreter every user can run (`make venv` uses "
            "/usr/bin/python3) in a directory every user can enter"
        )


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
