"""Who may do what on a shared node: the daemon's users, its admins, and job owners.

The daemon learns a caller's uid from SO_PEERCRED (Unix socket) or, over TCP, takes the bearer
token's holder as its own user. From the uid alone this module answers every access question:

- connect: a root daemon serves everyone who can open its socket (the socket group decides); a
  daemon run by an ordinary user serves that user only, since it would run others' jobs as itself;
- admin: root, the daemon's own user, and members of `--admin-group` drain the node and act on
  any job (as Slurm's operators do);
- see: a job's command, environment, logs and events are its owner's and the admins'; others see
  only its share (as squeue shows every job, PrivateData hides the rest).
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from gpupool.core.errors import ConfigError, PermissionDenied

ROOT_UID = 0


def user_name(uid: int) -> str:
    """The login name of `uid`, or the number when the system has no such user."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_id(name: str, option: str) -> int:
    """The gid of group `name`, or one line saying it does not exist."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(
            f"{option}: no group {name!r} on this machine (create it: groupadd --system {name})"
        ) from None


def _groups_of(uid: int) -> frozenset[int]:
    """Every group `uid` belongs to (primary and supplementary), as the system lists them now."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))


@dataclass(frozen=True)
class Access:
    """The access rules of one daemon."""

    #: the uid the daemon runs as
    daemon_uid: int
    #: members of this group are admins (None: root and the daemon's user only)
    admin_gid: int | None = None

    @classmethod
    def of_this_process(cls, admin_group: str | None = None) -> Access:
        gid = None if admin_group is None else group_id(admin_group, "--admin-group")
        return cls(os.geteuid(), gid)

    @property
    def serves_everyone(self) -> bool:
        return self.daemon_uid == ROOT_UID

    def may_connect(self, uid: int) -> bool:
        return self.serves_everyone or uid == self.daemon_uid

    def refuse_stranger(self, uid: int) -> None:
        """PermissionDenied for a caller a non-root daemon does not serve."""
        if not self.may_connect(uid):
            me = user_name(self.daemon_uid)
            raise PermissionDenied(f"this daemon runs as {me} and serves {me} only")

    def is_admin(self, uid: int) -> bool:
        if uid in (ROOT_UID, self.daemon_uid):
            return True
        return self.admin_gid is not None and self.admin_gid in _groups_of(uid)

    def may_see(self, uid: int, owner: int) -> bool:
        """Whether `uid` may read a job of `owner`'s command, environment, logs and events."""
        return uid == owner or self.is_admin(uid)

    def require_admin(self, uid: int, what: str) -> None:
        """PermissionDenied unless `uid` is an admin; `what` names the operation."""
        if not self.is_admin(uid):
            raise PermissionDenied(
                f"{what} is for admins (root and the daemon's --admin-group); "
                f"{user_name(uid)} is not one"
            )

    def require_owner(self, uid: int, owner: int, job_id: int, what: str) -> None:
        """PermissionDenied unless `uid` owns job `job_id` or is an admin."""
        if not self.may_see(uid, owner):
            raise PermissionDenied(
                f"job {job_id} belongs to {user_name(owner)}: only they or an admin may {what}"
            )
