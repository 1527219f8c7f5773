"""The ``bwrap`` sandbox: bubblewrap namespaces on the host's own root file system.

The command gets its own mount, pid, user, IPC, UTS and network namespaces (the network holds
only a loopback of its own: nothing of the host is reachable), no capabilities, the host's
``/usr`` and a few files of ``/etc`` read-only, fresh ``/proc``, ``/dev`` and ``/tmp`` (a tmpfs
no larger than the file-size limit), and the caller's binds, nothing else; the rest of its root
is read-only. Its environment is built from nothing. Limits are rlimits set by ``prlimit``
inside, but ``disk_mb``: the writable binds on a file system of that size (``disk``). Started
by root, bwrap runs as an unprivileged user, since the kernel applies no process limit to root:
each command a user of its own, leased from the pool for as long as it runs (``users``;
``uid`` fixes one instead). Writable binds are handed to that user, and every bind must be
readable by it. A prepared process may also reach the proxy's port on its own
loopback, relayed through a unix socket (``gyre_train.sandbox.relay``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import (
    NO_LIMITS,
    Bind,
    Limits,
    Prepared,
    ProxyRoute,
    RunResult,
    Sandbox,
    minimal_env,
    run_group,
)
from gyre_train.sandbox.disk import DiskCap
from gyre_train.sandbox.relay import INSIDE_SCRIPT, check_route, route_binds, routed
from gyre_train.sandbox.users import UserLease, check_reachable, hand_over, lease_user

ROOT_LINKS = ("bin", "lib", "lib64", "sbin")  # merged-/usr links (or folders) of the host root
ETC_FILES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "hosts",
)


def bwrap_missing() -> str | None:
    """Why bubblewrap cannot be used here, or None when it can."""
    if shutil.which("bwrap") is None:
        return "BUBBLEWRAP NOT INSTALLED: apt-get install bubblewrap"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "SETPRIV NOT INSTALLED (util-linux): bwrap started by root runs as an unprivileged user through it"
    return None


class BwrapSandbox(Sandbox):
    """Runs commands in bubblewrap namespaces (see the module docstring)."""

    kind = "bwrap"
    remaps = True
    python = "/usr/bin/python3"

    def __init__(self, *, uid: int | None = None) -> None:
        if (missing := bwrap_missing()) is not None:
            raise SandboxError(missing)
        self._uid = uid
        self._drop = os.geteuid() == 0

    def run(
        self,
        command: Sequence[str],
        *,
        workdir: str,
        binds: Sequence[Bind] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        limits: Limits = NO_LIMITS,
    ) -> RunResult:
        with lease_user(self._uid) as user, DiskCap(binds, limits.disk_mb):
            argv = self._argv(
                [*limits.prlimit(), *command], user, workdir=workdir, binds=binds, env=env, limits=limits
            )
            result = run_group(argv, cwd=None, env=_host_env(), timeout_s=timeout_s)
        if result.exit_code == 1 and result.stderr.startswith("bwrap:"):
            raise SandboxError(f"bwrap could not set up the sandbox: {result.stderr.strip().splitlines()[0]}")
        return result

    def prepare(
        self,
        command: Sequence[str],
        *,
        workdir: str,
        name: str,
        binds: Sequence[Bind] = (),
        env: Mapping[str, str] | None = None,
        limits: Limits = NO_LIMITS,
        route: ProxyRoute | None = None,
    ) -> Prepared:
        """``run``'s sandbox for a long-running command, plus the route: ``relay.route_binds``,
        and ``command`` started by ``relay.routed`` once ``127.0.0.1:port`` listens, the
        forwarder outside ``prlimit``. Nothing outlives the process group: bwrap dies with it
        (its child has ``--die-with-parent``), and with bwrap's init the kernel kills every
        process of the sandbox's pid namespace, the forwarder's too. Under ``disk_mb`` the
        writable binds are capped from now on: ``cleanup`` copies their files back. The
        command's user is leased here and given back by ``cleanup``."""
        inner = [*limits.prlimit(), *command]
        user = lease_user(self._uid)
        try:
            extra: list[str] = []
            if route is not None:
                extra = self._route_binds(route, user)
                inner = routed(inner, route, name)
            cap = DiskCap(binds, limits.disk_mb)
            argv = cap.mount_then(
                lambda: self._argv(
                    inner, user, workdir=workdir, binds=binds, env=env, limits=limits, extra=extra
                )
            )
        except BaseException:
            user.release()
            raise

        def cleanup() -> None:
            try:
                cap.release()
            finally:
                user.release()

        return Prepared(tuple(argv), _host_env(), cleanup)

    def _argv(
        self,
        inner: Sequence[str],
        user: UserLease,
        *,
        workdir: str,
        binds: Sequence[Bind],
        env: Mapping[str, str] | None,
        limits: Limits,
        extra: Sequence[str] = (),
    ) -> list[str]:
        """The bwrap command line that runs ``inner`` (limits already applied) in ``workdir``
        as ``user``."""
        if not inner:
            raise SandboxError("command: empty")
        if not workdir.startswith("/"):
            raise SandboxError(f"workdir: {workdir!r} must be an absolute path inside the sandbox")
        for bind in binds:
            if not bind.source.exists():
                raise SandboxError(f"binds: {bind.source} does not exist")
            if self._drop:
                if bind.writable:
                    hand_over(bind.source, user.uid, user.gid)
                check_reachable(bind.source, user.uid)
        # the root is bwrap's own tmpfs: once every mount point is made, nothing else may write it
        argv = [
            *self._prefix(user),
            *self._namespaces(limits),
            *self._binds(binds),
            *extra,
            "--remount-ro",
            "/",
            "--chdir",
            workdir,
        ]
        for key, value in minimal_env(workdir, env).items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *inner]

    def _route_binds(self, route: ProxyRoute, user: UserLease) -> list[str]:
        check_route(route)
        if self._drop:
            check_reachable(route.socket.parent, user.uid, what="route")
            check_reachable(INSIDE_SCRIPT, user.uid, what="route")
        return self._binds(route_binds(route))

    def _prefix(self, user: UserLease) -> list[str]:
        if not self._drop:
            return ["bwrap"]
        return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "bwrap"]

    @staticmethod
    def _namespaces(limits: Limits) -> list[str]:
        args = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv"]
        args += ["--cap-drop", "ALL", "--ro-bind", "/usr", "/usr"]
        for name in ROOT_LINKS:
            path = Path("/", name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for name in ETC_FILES:
            if Path("/etc", name).exists():
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        if limits.file_size_mb is not None:  # else a tmpfs may grow to half the host's memory
            args += ["--size", str(limits.file_size_mb * 2**20)]
        return [*args, "--tmpfs", "/tmp"]

    @staticmethod
    def _binds(binds: Sequence[Bind]) -> list[str]:
        args: list[str] = []
        for bind in binds:
            args += ["--bind" if bind.writable else "--ro-bind", str(bind.source), bind.target]
        return args


def _host_env() -> dict[str, str]:
    """What bwrap itself runs with: the host's PATH, nothing else (the sandbox's is --setenv)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
