"""A root daemon that real Unix users reach through its socket group, for the multi-user tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import Daemon
from tests.users import (
    User,
    add_to_group,
    check_interpreter,
    create_group,
    remove_group,
    remove_tree,
    users,
    world_dir,
)


@contextmanager
def group_daemon(
    spec: str,
    count: int = 2,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    default_node: bool = False,
) -> Iterator[tuple[Daemon, list[User]]]:
    """`gpupool serve --socket-group G EXTRA...` on a simulated node of `spec`, in a directory
    every user may enter (or where serve puts it, `default_node`), with `env`, and `count` fresh
    users in G; daemon, jobs, users, group and directory are gone afterwards."""
    root = world_dir()
    group = create_group()
    try:
        with users(count) as made:
            for user in made:
                add_to_group(user, group)
            check_interpreter(made[0])
            daemon = Daemon(
                root, spec, ("--socket-group", group, *extra), env or {}, None, default_node
            ).start()
            try:
                yield daemon, made
            finally:
                daemon.stop()
                _kill_jobs(daemon)
    finally:
        remove_group(group)
        remove_tree(root)
