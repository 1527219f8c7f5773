"""The unprivileged user a confined command runs as: every ``bwrap`` command, and a harness
prepared under ``podman`` or ``docker``.

Started by root, the sandbox runs as ``nobody`` (uid and gid 65534) unless told another uid, and
hands its writable binds to that user first (``hand_over``): the files its command writes stay
that user's on the host, where root (the evaluator, the launcher) still reads, writes and
deletes them. Every bind must then be readable by that user (``check_reachable``). Started by
another user, the sandbox runs as that user itself: its files are already its own.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Bind

NOBODY = 65534


def sandbox_user(uid: int = NOBODY) -> tuple[int, int]:
    """The (uid, gid) a confined command runs as: ``uid`` (its gid the same number) when gyre
    runs as root, else gyre's own user and group."""
    if os.geteuid() == 0:
        if uid == 0:
            raise SandboxError("uid: a sandbox's user may not be root (0)")
        return uid, uid
    return os.geteuid(), os.getegid()


def hand_over(root: Path, uid: int, gid: int | None = None) -> None:
    """Make ``root`` and everything under it ``uid``'s (group ``gid``, default ``uid``), so the
    sandbox's user may write it."""
    gid = uid if gid is None else gid
    os.chown(root, uid, gid, follow_symlinks=False)
    if root.is_dir() and not root.is_symlink():
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def check_reachable(path: Path, uid: int, *, what: str = "binds") -> None:
    """Raise SandboxError unless user ``uid`` (no groups) can reach and read ``path``."""
    resolved = path.resolve()
    for folder in [*reversed(resolved.parents), resolved]:
        info = folder.stat()
        own = info.st_uid == uid
        need = stat.S_IXUSR if own else stat.S_IXOTH
        if folder == resolved:
            need = (stat.S_IRUSR if own else stat.S_IROTH) | (need if folder.is_dir() else 0)
        if info.st_mode & need != need:
            raise SandboxError(
                f"{what}: {path} is not readable by the sandbox's user {uid} ({folder} has mode "
                f"{stat.filemode(info.st_mode)}); put it in a folder others may read"
            )


def hand_binds_over(binds: Sequence[Bind], user: tuple[int, int], *, route: Sequence[Bind] = ()) -> None:
    """As root: hand each writable bind to ``user`` and check that it reaches every bind, the
    ``route``'s too (SandboxError naming the first it cannot). Not root: nothing to do, the
    user being gyre's own."""
    if os.geteuid() != 0:
        return
    uid, gid = user
    for bind in binds:
        if not bind.source.exists():
            raise SandboxError(f"binds: {bind.source} does not exist")
        if bind.writable:
            hand_over(bind.source, uid, gid)
        check_reachable(bind.source, uid)
    for bind in route:
        check_reachable(bind.source, uid, what="route")
