"""The ``podman`` sandbox: each command in a fresh rootful container of an image built locally.

The container has no network (``--network none``), an environment built from nothing (podman's
and the image's variables unset, then ``minimal_env``), the caller's binds (read-only unless
writable), memory and process limits as cgroup limits, CPU time and file size as rlimits set by
``prlimit`` inside (``images.in_container``), the total of the writable binds by a file system
of ``disk_mb`` mounted over them (``disk``); its own root file system is the image's, writable
and discarded with it. A timeout removes the container (killing the client leaves it running).
A one-off ``run`` (a task's tests) runs as the image's user in a user namespace of its own: the
container's uids 0 to 65,535 are ``users.CONTAINER_ROOT`` onwards on the host, so the image's
root is no user of the host, and its writable binds are handed to that uid first. A prepared
harness runs as an unprivileged user with no capabilities (``prepare``).

Podman runs with ``--runtime runc --cgroup-manager cgroupfs`` and ``CONTAINERS_CONF`` pointing to
gyre's containers.conf (``/etc/containers/gyre.conf``): ``tools/podman_setup.sh`` writes it and
builds the base image. crun fails on such hosts (``setrlimit RLIMIT_NOFILE``, hybrid cgroups).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import (
    DEFAULT_PATH,
    NO_LIMITS,
    Bind,
    Limits,
    Prepared,
    RunResult,
    run_group,
)
from gyre_train.sandbox.disk import DiskCap
from gyre_train.sandbox.images import (
    BASE_IMAGE,
    SETUP,
    ContainerSandbox,
    Harness,
    check_binds,
    container_env,
    container_name,
    in_container,
)
from gyre_train.sandbox.users import CONTAINER_IDS, UserLease, container_root, hand_binds_over

CONF = Path("/etc/containers/gyre.conf")
GLOBAL_FLAGS = ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
BUILD_TIMEOUT_S = 1800.0
QUERY_TIMEOUT_S = 60.0  # an image query or a removal; podman waits on its storage lock


def containers_conf() -> str | None:
    """The containers.conf podman is run with: ``CONTAINERS_CONF`` if set, else gyre's own."""
    return os.environ.get("CONTAINERS_CONF") or (str(CONF) if CONF.is_file() else None)


def podman_missing() -> str | None:
    """Why rootful podman cannot be used here, or None when it can."""
    for program in ("podman", "runc"):
        if shutil.which(program) is None:
            return f"{program.upper()} NOT INSTALLED: run {SETUP}"
    if os.geteuid() != 0:
        return "podman sandboxes are rootful: run gyre as root"
    if containers_conf() is None:
        return f"no containers.conf for gyre at {CONF}: run {SETUP}"
    return None


def podman_env() -> dict[str, str]:
    """The environment the podman client itself runs with (not the container's)."""
    env = {"PATH": os.environ.get("PATH", DEFAULT_PATH), "HOME": os.environ.get("HOME", "/root")}
    if (conf := containers_conf()) is not None:
        env["CONTAINERS_CONF"] = conf
    return env


def run_args(
    image: str,
    command: Sequence[str],
    *,
    name: str,
    workdir: str,
    binds: Sequence[Bind] = (),
    env: Mapping[str, str] | None = None,
    limits: Limits = NO_LIMITS,
    harness: Harness | None = None,
    mapped_root: int | None = None,
) -> list[str]:
    """``podman run`` arguments (after the global flags) for ``command`` in a new container
    ``name`` of ``image``, removed when it ends; a ``harness`` (``prepare``'s) adds an init, a
    read-only root with a tmpfs ``/tmp``, its user with no capabilities, and the route. With
    ``mapped_root`` the container's uids and gids 0 to ``CONTAINER_IDS - 1`` are that host id
    onwards (a user namespace). Raises SandboxError for an empty command."""
    args = ["run", "--rm", "--name", name, "--network", "none", "--unsetenv-all"]
    args += ["--security-opt", "no-new-privileges", "--pull", "never", "--entrypoint", "", "-w", workdir]
    if mapped_root is not None:
        args += [
            "--uidmap",
            f"0:{mapped_root}:{CONTAINER_IDS}",
            "--gidmap",
            f"0:{mapped_root}:{CONTAINER_IDS}",
        ]
    if harness is not None:
        # an init as PID 1 passes on the signals podman forwards (a PID 1 without handlers ignores them)
        args += [
            "--init",
            "--read-only",
            "--read-only-tmpfs=false",
            "--tmpfs",
            f"/tmp:{Harness.tmp_options(limits)}",
        ]
        if (user := harness.user_spec()) is not None:
            args += ["--user", user, "--cap-drop", "all"]
        binds = harness.binds(binds)
    if limits.memory_mb is not None:  # swap as large as memory: none beyond it
        args += ["--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m"]
    if limits.processes is not None:
        pids = limits.processes if harness is None else harness.pids_limit(limits.processes, init=True)
        args += ["--pids-limit", str(pids)]
    for bind in binds:
        args += ["-v", f"{bind.source}:{bind.target}" + ("" if bind.writable else ":ro")]
    for key, value in container_env(workdir, env).items():
        args += ["--env", f"{key}={value}"]
    inner = in_container(command, limits) if harness is None else harness.command(command, limits)
    return [*args, image, *inner]


class PodmanSandbox(ContainerSandbox):
    """Runs commands in podman containers of ``image`` (see the module docstring)."""

    kind = "podman"

    def __init__(self, *, image: str = BASE_IMAGE, uid: int | None = None) -> None:
        if (missing := podman_missing()) is not None:
            raise SandboxError(missing)
        self.image = image
        self.uid = uid
        self._env = podman_env()

    def with_image(self, image: str) -> Self:
        clone = copy.copy(self)
        clone.image = image
        return clone

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
        check_binds(workdir, binds)
        name = container_name()
        root = container_root()
        args = run_args(
            self.image,
            command,
            name=name,
            workdir=workdir,
            binds=binds,
            env=env,
            limits=limits,
            mapped_root=root,
        )
        argv = ["podman", *GLOBAL_FLAGS, *args]
        ended = False
        with DiskCap(binds, limits.disk_mb):
            # the image's root is host uid ``root``: the writable binds become its, on the capped files
            hand_binds_over(binds, (root, root))
            try:
                with tempfile.TemporaryDirectory(prefix="gyre-podman-") as scratch:
                    # podman's conmon leaves an empty file "oom" in its working folder when the
                    # container's memory limit is hit: a scratch folder, not the caller's
                    result = run_group(argv, cwd=Path(scratch), env=self._env, timeout_s=timeout_s)
                ended = not result.timed_out and 0 <= result.exit_code < 125
            finally:
                if not ended:  # the client was killed (or failed): the container may live on
                    self.remove(name)
        if result.exit_code == 125 and result.stderr.startswith("Error:"):
            raise SandboxError(
                f"podman could not start the container: {result.stderr.strip().splitlines()[0]}"
            )
        return result

    def _prepare(
        self,
        command: Sequence[str],
        user: UserLease,
        harness: Harness,
        container: str,
        *,
        workdir: str,
        binds: Sequence[Bind],
        env: Mapping[str, str] | None,
        limits: Limits,
    ) -> Prepared:
        """``prepare``'s container, with an init (``--user``, ``--cap-drop all`` for its user).
        Killing the ``podman run`` client leaves the container running: ``cleanup`` removes it,
        and every process in it, then copies the files of writable binds capped by ``disk_mb``
        back (``disk.DiskCap``), then gives ``user`` back."""
        args = run_args(
            self.image,
            command,
            name=container,
            workdir=workdir,
            binds=binds,
            env=env,
            limits=limits,
            harness=harness,
        )
        # started in a scratch folder of its own (``run``'s reason), removed by the cleanup
        scratch = Path(tempfile.mkdtemp(prefix="gyre-podman-"))
        cap = DiskCap(binds, limits.disk_mb)
        try:
            # onto the capped binds, the files the command sees
            cap.mount_then(lambda: harness.hand_over(binds))
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

        def cleanup() -> None:
            try:
                self.remove(container)  # nothing writes the capped binds any more
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
                cap.release()
            user.release()  # once the container, and every process of its user, is gone

        argv = ("env", f"--chdir={scratch}", "podman", *GLOBAL_FLAGS, *args)
        return Prepared(argv, self._env, cleanup)

    def remove(self, name: str) -> None:
        """Remove container ``name`` now, killing what runs in it; nothing if there is none."""
        self._podman("rm", "--force", "--ignore", "--time", "0", name)

    def has_image(self, image: str) -> bool:
        return self._podman("image", "exists", image).returncode == 0

    def image_id(self, image: str) -> str:
        done = self._podman("image", "inspect", "--format", "{{.Id}}", image)
        if done.returncode != 0:
            hint = f"; run {SETUP}" if image == BASE_IMAGE else ""
            raise SandboxError(f"image {image} is not present in podman's storage{hint}")
        return done.stdout.strip()

    def build(self, context: Path, dockerfile: str, tag: str) -> None:
        done = self._podman(
            "build",
            "--pull=never",
            "--network=none",
            "--quiet",
            "--file",
            str(context / dockerfile),
            "--tag",
            tag,
            str(context),
            timeout_s=BUILD_TIMEOUT_S,
        )
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-3:] or [f"exit {done.returncode}"]
            raise SandboxError(f"podman build of {tag} failed: {' | '.join(tail)}")

    def _podman(self, *args: str, timeout_s: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["podman", *GLOBAL_FLAGS, *args],
                env=self._env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"podman {args[0]} took over {timeout_s:g} s") from exc
        except OSError as exc:
            raise SandboxError(f"cannot run podman: {exc.strerror}") from exc
