"""Container images: what a container sandbox (``podman``, ``docker``) shares, which image it runs
and how a task's image is built, with no registry to pull from.

A ``FROM`` that is not present locally is rewritten to the base image (``localhost/gyre-base``:
the host's own ``/usr``, built by ``tools/podman_setup.sh``), with a note; a built image is tagged
by a hash of everything that went into it, so an unchanged Dockerfile is never built twice. An
image named outright (Harbor's ``docker_image``) must be present: it is the task's whole
environment, and a stand-in would fail its tests for the wrong reason. Knows nothing of tasks.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import uuid
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import NO_LIMITS, Bind, Limits, Prepared, ProxyRoute, Sandbox, minimal_env
from gyre_train.sandbox.relay import check_route, route_binds, routed
from gyre_train.sandbox.users import UserLease, hand_binds_over, lease_user

log = logging.getLogger(__name__)

BASE_IMAGE = "localhost/gyre-base:latest"
TASK_REPO = "localhost/gyre-task"  # built images: TASK_REPO:<content hash>
BUILT_DOCKERFILE = ".gyre.Dockerfile"  # the rewritten Dockerfile, written into a copy of the context
SETUP = "tools/podman_setup.sh"
FROM_LINE = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Rewritten:
    """A Dockerfile whose missing base images were replaced: its text, the images its stages
    start from, and one note per FROM replaced."""

    text: str
    bases: tuple[str, ...]
    notes: tuple[str, ...]


def rewrite_from(text: str, present: Callable[[str], bool], base: str = BASE_IMAGE) -> Rewritten:
    """``text`` with every ``FROM`` image that is not ``present`` (nor ``scratch``, nor an earlier
    stage's name) replaced by ``base``; continuation lines and ``ARG`` in FROM are left alone."""
    stages: set[str] = set()
    lines: list[str] = []
    bases: list[str] = []
    notes: list[str] = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        match = FROM_LINE.match(body)
        if match is None:
            lines.append(line)
            continue
        head, flags, image, rest = match.groups()
        if image.lower() in stages or image == "scratch" or "$" in image:
            lines.append(line)
        elif present(image):
            lines.append(line)
            bases.append(image)
        else:
            notes.append(f"FROM {image} is not present locally (no registry is reachable): built FROM {base}")
            lines.append(f"{head}{flags}{base}{rest}{line[len(body) :]}")
            bases.append(base)
        if alias := re.match(r"\s+AS\s+(\S+)", rest, re.IGNORECASE):
            stages.add(alias.group(1).lower())
    return Rewritten("".join(lines), tuple(bases), tuple(notes))


def context_hash(dockerfile_text: str, context: Path, base_ids: Sequence[str]) -> str:
    """Hex sha256 of the Dockerfile as built, every file of its context (path, mode, bytes) and
    the ids of the images it starts from: a changed base (a host upgraded) builds anew."""
    digest = hashlib.sha256()
    for part in (dockerfile_text, *base_ids):
        digest.update(len(part).to_bytes(8, "big") + part.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(context).as_posix()
        info = path.lstat()
        digest.update(f"{len(rel)}:{rel}:{info.st_mode:o}".encode())
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def built_context(dockerfile: Path, rewritten: Rewritten, into: Path) -> Path:
    """A copy of ``dockerfile``'s folder in ``into`` with the rewritten Dockerfile beside it (as
    ``BUILT_DOCKERFILE``): what an engine builds. Returns the copy."""
    context = into / "context"
    shutil.copytree(dockerfile.parent, context, symlinks=True)
    (context / BUILT_DOCKERFILE).write_text(rewritten.text)
    return context


def in_container(command: Sequence[str], limits: Limits) -> list[str]:
    """``command`` under the limits a container engine does not apply itself: CPU time and file
    size as rlimits set by ``prlimit`` inside (an engine's ``--ulimit`` makes podman add open-file
    and process rlimits above what this host lets runc set). Memory and processes are the
    container's cgroup limits (``container_memory``, ``limits.processes``)."""
    if not command:
        raise SandboxError("command: empty")
    return [*replace(limits, memory_mb=None, processes=None).prlimit(), *command]


@dataclass(frozen=True, slots=True)
class Harness:
    """What a prepared (long-running) container has that a one-off run's has not: ``name``, the
    execution's, marking its processes; the ``route`` to the proxy, if any; the ``user`` (uid,
    gid) its command runs as, with no capabilities (``users.lease_user``; None: the image's
    user); and, as under bwrap, a read-only root file system with a fresh ``/tmp`` no larger
    than the file-size limit (a container's own writable layer lies on the host's disk, with no
    limit on its total).

    A container's process and memory limits are its cgroup's and hold every process in it, the
    forwarder's too: ``pids_limit`` adds the container's own helpers to what the command gets.
    """

    name: str
    route: ProxyRoute | None = None
    user: tuple[int, int] | None = None

    def check(self) -> None:
        """Raise SandboxError when the route's socket is not served (``relay.check_route``)."""
        if self.route is not None:
            check_route(self.route)

    def binds(self, binds: Sequence[Bind]) -> list[Bind]:
        """The caller's binds, then the route's (``relay.route_binds``)."""
        return [*binds, *(route_binds(self.route) if self.route is not None else ())]

    def command(self, command: Sequence[str], limits: Limits) -> list[str]:
        """``in_container(command, limits)``, started behind the route's forwarder when there is
        one (``relay.routed``): the forwarder is outside ``prlimit``, as under bwrap."""
        inner = in_container(command, limits)
        return inner if self.route is None else routed(inner, self.route, self.name)

    def hand_over(self, binds: Sequence[Bind]) -> None:
        """As root, hand the writable ``binds`` to ``user`` and check that it reads every bind,
        the route's too (``users.hand_binds_over``; SandboxError naming one it cannot). Called
        with the writable binds already capped (``disk.DiskCap.mount``), so that the hand-over
        reaches the files the command sees."""
        if self.user is not None:
            hand_binds_over(binds, self.user, route=self.binds(()))

    def user_spec(self) -> str | None:
        """``uid:gid`` for the engine's user option, or None for the image's user."""
        return None if self.user is None else f"{self.user[0]}:{self.user[1]}"

    def pids_limit(self, processes: int, *, init: bool) -> int:
        """The cgroup's process limit for a command allowed ``processes``: plus the engine's init
        process (``init``) and the forwarder, so that neither takes from the command's share."""
        return processes + int(init) + int(self.route is not None)

    @staticmethod
    def tmp_options(limits: Limits) -> str:
        """The options of the tmpfs at ``/tmp``: executable like bwrap's, as large as the
        file-size limit (without one, the kernel's default for a tmpfs: half the host's memory)."""
        size = "" if limits.file_size_mb is None else f",size={limits.file_size_mb}m"
        return f"rw,exec,nosuid,nodev,mode=1777{size}"


def container_env(workdir: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The container's environment: ``minimal_env``, HOME the working directory."""
    return minimal_env(workdir, env)


def check_binds(workdir: str, binds: Sequence[Bind]) -> None:
    """Raise SandboxError for a relative working directory, a missing bind source, or a path a
    volume argument cannot carry."""
    if not workdir.startswith("/"):
        raise SandboxError(f"workdir: {workdir!r} must be an absolute path inside the sandbox")
    for bind in binds:
        if not bind.source.exists():
            raise SandboxError(f"binds: {bind.source} does not exist")
        if not bind.target.startswith("/"):
            raise SandboxError(f"binds: target {bind.target!r} must be an absolute path")
        if any(ch in f"{bind.source}{bind.target}" for ch in ":,\n"):
            raise SandboxError(
                f"binds: {bind.source} -> {bind.target}: a path may not hold ':' ',' or a newline"
            )


def container_name(name: str | None = None) -> str:
    """A container name: ``gyre-NAME`` (made safe), or ``gyre-<random>`` for a one-off run."""
    if name is None:
        return f"gyre-{uuid.uuid4().hex[:16]}"
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", name)
    return f"gyre-{safe}"[:200]


class ContainerSandbox(Sandbox):
    """A sandbox that runs commands in containers of ``image``; ``image_for`` chooses (and
    builds) a task's image, ``with_image`` gives the same sandbox running another. A prepared
    harness runs, when gyre is root, as a user leased for it from the pool (``users.lease_user``)
    or as ``uid`` when one is given; a one-off ``run`` as the image's user."""

    remaps = True
    python = "/usr/bin/python3"  # the base image's (the host's); an image of a task's own may differ
    image: str
    uid: int | None = None  # None: each prepared harness a user of the pool's (``users.lease_user``)

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
        """``run``'s container for a long-running command, shaped by ``Harness`` (a read-only
        root with a tmpfs ``/tmp``, the route when given), run as an unprivileged user with no
        capabilities: as root, a user leased for it (``users.lease_user``), the writable binds
        handed to it with their files; the lease is given back by the cleanup, or here when the
        preparation fails."""
        user = lease_user(self.uid)
        try:
            harness = Harness(name, route, user.user)
            harness.check()
            check_binds(workdir, harness.binds(binds))
            return self._prepare(
                command,
                user,
                harness,
                container_name(name),
                workdir=workdir,
                binds=binds,
                env=env,
                limits=limits,
            )
        except BaseException:
            user.release()
            raise

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
        """``prepare``'s container ``container`` for ``command`` as ``harness`` says, the writable
        binds handed to ``user``; its cleanup gives ``user`` back once the container is gone."""
        raise SandboxError(f"the {self.kind} sandbox cannot start long-running processes")

    @abstractmethod
    def with_image(self, image: str) -> Self:
        """This sandbox, running ``image``."""

    @abstractmethod
    def has_image(self, image: str) -> bool:
        """Whether ``image`` is present locally."""

    @abstractmethod
    def image_id(self, image: str) -> str:
        """The id of ``image``, present locally; raises SandboxError when it is not."""

    @abstractmethod
    def build(self, context: Path, dockerfile: str, tag: str) -> None:
        """Build ``context`` (its file ``dockerfile``) as ``tag``; raises SandboxError naming why not."""

    def image_for(self, dockerfile: Path | None, image: str | None) -> str:
        """The image to run: ``dockerfile`` built (see the module docstring), else ``image`` if it
        is present, else the base image. Raises SandboxError when a build fails, the base image
        is missing, or a named ``image`` is not present."""
        if dockerfile is None:
            if image is None:
                self.image_id(BASE_IMAGE)
                return BASE_IMAGE
            if not self.has_image(image):
                raise SandboxError(
                    f"image {image!r} is not present locally and no registry is reachable: load it "
                    f"(podman load -i FILE.tar) or give the task an environment/Dockerfile"
                )
            return image
        rewritten = rewrite_from(dockerfile.read_text(), self.has_image)
        with tempfile.TemporaryDirectory(prefix="gyre-build-") as scratch:
            context = built_context(dockerfile, rewritten, Path(scratch))
            base_ids = [self.image_id(b) for b in rewritten.bases]
            tag = f"{TASK_REPO}:{context_hash(rewritten.text, context, base_ids)[:32]}"
            if self.has_image(tag):
                return tag
            for note in rewritten.notes:
                log.warning("%s: %s", dockerfile, note)
            self.build(context, BUILT_DOCKERFILE, tag)
        return tag
