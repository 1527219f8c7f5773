"""The unprivileged user a confined command runs as: every ``bwrap`` command, and a harness
prepared under ``podman`` or ``docker``.

Started by root, each confined command runs as a user of its own, leased from a pool
(``lease_user``): uids ``POOL_FIRST`` to ``POOL_FIRST + POOL_SIZE - 1``, less any uid
``/etc/passwd`` names or ``/etc/subuid`` gives a user. The lease is an exclusive ``flock`` on a
file named by the uid under ``LEASES``, so processes on one host never hold the same uid at once,
and a process that dies releases its leases with it. A sandbox given a uid (``uid=``) runs as
that uid instead, unleased. A user of its own per command matters because the kernel counts
``RLIMIT_NPROC`` (``Limits.processes``) over every process of a user: sandboxes sharing one user
(``nobody``, as before) share one process count, so one sandbox's processes would take from
another's. The sandbox hands its writable binds to its user first (``hand_over``): the files its
command writes stay that uid's on the host, where root (the evaluator, the launcher) still
reads, writes and deletes them. Every bind must then be readable by that user
(``check_reachable``). Started by another user, the sandbox runs as that user itself: its files
are already its own, and its sandboxes share that user's process count.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import random
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Bind

NOBODY = 65534
POOL_FIRST = 2_000_000  # above the uids /etc/subuid gives the first 29 users by default
POOL_SIZE = 65_536
LEASES = Path("/run/gyre/sandbox-uids")  # one lock file per leased uid; root's only
# A one-off podman container's user namespace: its uids 0 to 65,535 are these on the host.
CONTAINER_ROOT = 3_000_000
CONTAINER_IDS = 65_536


class UserLease:
    """A (uid, gid) a confined command runs as, held until ``release``: from the pool (a lock
    file held under ``LEASES``), or a fixed one (nothing held)."""

    def __init__(self, uid: int, gid: int, lock: tuple[int, Path] | None = None) -> None:
        self.uid = uid
        self.gid = gid
        self._lock = lock
        self._guard = threading.Lock()

    @property
    def user(self) -> tuple[int, int]:
        return self.uid, self.gid

    @property
    def leased(self) -> bool:
        """Whether the uid is the pool's (and still held)."""
        return self._lock is not None

    def release(self) -> None:
        """Give the uid back to the pool (nothing for a fixed one; a second call does nothing).
        The file goes first, then the lock: a leaser that opened the file before it went finds
        its lock on a removed file and tries again."""
        with self._guard:
            lock, self._lock = self._lock, None
        if lock is not None:
            fd, path = lock
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            os.close(fd)

    def __enter__(self) -> UserLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def sandbox_user(uid: int | None = None) -> tuple[int, int]:
    """The (uid, gid) of a fixed user: ``uid`` (its gid the same number) when gyre runs as root
    (``NOBODY`` when None), else gyre's own user and group. A sandbox's commands lease theirs
    instead (``lease_user``)."""
    if os.geteuid() == 0:
        uid = NOBODY if uid is None else uid
        if uid == 0:
            raise SandboxError("uid: a sandbox's user may not be root (0)")
        return uid, uid
    return os.geteuid(), os.getegid()


def lease_user(
    uid: int | None = None, *, first: int = POOL_FIRST, size: int = POOL_SIZE, folder: Path = LEASES
) -> UserLease:
    """The user one confined command runs as, until the lease's ``release``: as root, a uid
    (gid the same number) of the pool no other process of this host holds, or ``uid`` when
    given; not root, gyre's own user. Raises SandboxError for uid 0 and when every uid of the
    pool is held."""
    if os.geteuid() != 0 or uid is not None:
        return UserLease(*sandbox_user(uid))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    users, ranges = _host_uids()
    start = random.randrange(size)  # a uid just released is not the next one leased
    for i in range(size):
        candidate = first + (start + i) % size
        if candidate in users or any(candidate in r for r in ranges):
            continue
        if (held := _try_lock(folder / str(candidate))) is not None:
            return UserLease(candidate, candidate, (held, folder / str(candidate)))
    raise SandboxError(
        f"uid: every uid of the sandbox pool ({first} to {first + size - 1}) is held ({folder})"
    )


def container_root() -> int:
    """The host uid (and gid) a one-off podman container's root is: ``CONTAINER_ROOT``, its
    ``CONTAINER_IDS`` uids the container's. Raises SandboxError when a host user has a uid of
    that range (``/etc/passwd``, ``/etc/subuid``)."""
    users, ranges = _host_uids()
    mapped = range(CONTAINER_ROOT, CONTAINER_ROOT + CONTAINER_IDS)
    clash = sorted(uid for uid in users if uid in mapped) + [
        r.start for r in ranges if r.start < mapped.stop and mapped.start < r.stop
    ]
    if clash:
        raise SandboxError(
            f"uid: a one-off container's uids ({mapped.start} to {mapped.stop - 1}) overlap a host user's (from {clash[0]})"
        )
    return CONTAINER_ROOT


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding ``path``'s exclusive lock, or None when another holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise SandboxError(f"uid: cannot lock {path}: {exc.strerror}") from exc
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # released and removed while we waited: lock the file there now


def _host_uids() -> tuple[set[int], list[range]]:
    """The uids this host's users have: ``/etc/passwd``'s, and the ranges ``/etc/subuid``
    gives (a user's containers run as those)."""
    ranges: list[range] = []
    with contextlib.suppress(OSError):
        for line in Path("/etc/subuid").read_text().splitlines():
            parts = line.strip().split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                ranges.append(range(int(parts[1]), int(parts[1]) + int(parts[2])))
    return {entry.pw_uid for entry in pwd.getpwall()}, ranges


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
