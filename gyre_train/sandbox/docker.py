"""The ``docker`` sandbox: the ``podman`` sandbox's containers through the Docker Engine API.

The same container as ``podman`` (no network, the caller's binds, memory and process limits in
the cgroup, CPU time and file size by ``prlimit`` inside, the writable binds' total by ``disk``,
mounted on this host), created, started, waited on and removed by the ``docker`` SDK at
``base_url`` (default ``DOCKER_HOST``). The API cannot unset an
image's own ``ENV``: those variables stay beneath ``minimal_env`` (a task's image built from its
Dockerfile holds only the task's). A prepared harness runs as an unprivileged user with no
capabilities, as under ``podman``. Tested against podman's Docker-compatible service.

``prepare`` runs ``python -m gyre_train.sandbox.docker attach SPEC``: a small client that starts
the container, copies its output, exits with its status, and removes it on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Self

import docker  # type: ignore[import-untyped]
import requests
from docker.errors import BuildError, DockerException, ImageNotFound, NotFound  # type: ignore[import-untyped]
from docker.types import Mount  # type: ignore[import-untyped]

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import (
    DEFAULT_PATH,
    NO_LIMITS,
    TAIL_CHARS,
    Bind,
    Limits,
    Prepared,
    ProxyRoute,
    RunResult,
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
from gyre_train.sandbox.users import UserLease

DEFAULT_HOST = "unix:///var/run/docker.sock"
API_TIMEOUT_S = 60
# Named, not negotiated: negotiating connects in the constructor, before there is a client to
# close. Docker Engine 20.10 and podman 4's compatible service both speak it.
API_VERSION = "1.41"
BUILD_TIMEOUT_S = 1800
KILLED = -signal.SIGKILL  # the exit code of a container killed on timeout


def docker_host(base_url: str | None = None) -> str:
    """The Docker engine to use: ``base_url``, else ``DOCKER_HOST``, else the default socket."""
    return base_url or os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def create_kwargs(
    image: str,
    command: Sequence[str],
    *,
    name: str,
    workdir: str,
    binds: Sequence[Bind] = (),
    env: Mapping[str, str] | None = None,
    limits: Limits = NO_LIMITS,
    harness: Harness | None = None,
) -> dict[str, Any]:
    """Arguments of ``containers.create`` for ``command`` in a new container ``name`` of ``image``;
    a ``harness`` (``prepare``'s) adds a read-only root with a tmpfs ``/tmp``, its user with no
    capabilities, and the route."""
    if harness is not None:
        binds = harness.binds(binds)
    kwargs: dict[str, Any] = {
        "image": image,
        "command": in_container(command, limits) if harness is None else harness.command(command, limits),
        "entrypoint": [],
        "name": name,
        "working_dir": workdir,
        "environment": container_env(workdir, env),
        "network_mode": "none",
        "security_opt": ["no-new-privileges"],
        "mounts": [Mount(b.target, str(b.source), type="bind", read_only=not b.writable) for b in binds],
    }
    if limits.memory_mb is not None:  # swap as large as memory: none beyond it
        kwargs["mem_limit"] = kwargs["memswap_limit"] = f"{limits.memory_mb}m"
    if limits.processes is not None:  # a harness's count leaves room for its forwarder
        pids = limits.processes if harness is None else harness.pids_limit(limits.processes, init=False)
        kwargs["pids_limit"] = pids
    if harness is not None:
        kwargs["read_only"] = True
        kwargs["tmpfs"] = {"/tmp": Harness.tmp_options(limits)}
        if (user := harness.user_spec()) is not None:
            kwargs["user"] = user
            kwargs["cap_drop"] = ["ALL"]
    return kwargs


class DockerSandbox(ContainerSandbox):
    """Runs commands in containers through the Docker Engine API (see the module docstring)."""

    kind = "docker"

    def __init__(
        self, *, image: str = BASE_IMAGE, base_url: str | None = None, uid: int | None = None
    ) -> None:
        self.image = image
        self.uid = uid
        self.base_url = docker_host(base_url)
        client = None
        try:
            _probe(self.base_url)
            client = docker.DockerClient(base_url=self.base_url, version=API_VERSION, timeout=API_TIMEOUT_S)
            client.ping()
        except (DockerException, requests.RequestException, OSError) as exc:
            if client is not None:
                client.close()
            raise SandboxError(
                f"no Docker engine answers at {self.base_url}: start one, or podman's (run {SETUP}, then "
                f"`podman system service --time=0 unix:///run/gyre-podman.sock` and set DOCKER_HOST to it)"
            ) from exc
        self._client = client

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_image(self, image: str) -> Self:
        clone = copy.copy(self)
        clone.image = image
        return clone

    def close(self) -> None:
        """Close the connection to the engine (shared by every ``with_image`` copy)."""
        self._client.close()

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
        if timeout_s <= 0:
            raise SandboxError(f"timeout_s must be positive, got {timeout_s}")
        check_binds(workdir, binds)
        kwargs = create_kwargs(
            self.image, command, name=container_name(), workdir=workdir, binds=binds, env=env, limits=limits
        )
        with DiskCap(binds, limits.disk_mb):
            return self._run(kwargs, timeout_s)

    def _run(self, kwargs: dict[str, Any], timeout_s: float) -> RunResult:
        started = time.monotonic()
        try:
            container = self._client.containers.create(**kwargs)
        except DockerException as exc:
            raise SandboxError(f"the Docker engine could not create the container: {_why(exc)}") from exc
        try:
            container.start()
            try:
                exit_code, timed_out = int(container.wait(timeout=timeout_s)["StatusCode"]), False
            except requests.RequestException:  # the wait's own timeout
                container.kill()
                exit_code, timed_out = KILLED, True
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
        except DockerException as exc:
            raise SandboxError(f"the Docker engine failed the container: {_why(exc)}") from exc
        finally:
            _remove(container)
        return RunResult(
            exit_code, out[-TAIL_CHARS:], err[-TAIL_CHARS:], time.monotonic() - started, timed_out
        )

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
        """``prepare``'s container, run by ``attach`` in a process of its own; ``cleanup``
        removes the container, and every process in it, then copies the files of writable binds
        capped by ``disk_mb`` back (``disk.DiskCap``: mounted here, on this host, so the engine
        must be this host's), then gives ``user`` back."""
        spec = {
            "image": self.image,
            "command": list(command),
            "name": container,
            "workdir": workdir,
            "binds": [[str(b.source), b.target, b.writable] for b in binds],
            "env": dict(env or {}),
            "limits": [limits.memory_mb, limits.cpu_s, limits.processes, limits.file_size_mb],
            "harness": [
                harness.name,
                None if harness.route is None else [str(harness.route.socket), harness.route.port],
                harness.user,
            ],
        }
        argv = (sys.executable, "-m", "gyre_train.sandbox.docker", "attach", self.base_url, json.dumps(spec))
        env_out = {"PATH": os.environ.get("PATH", DEFAULT_PATH), "HOME": os.environ.get("HOME", "/root")}
        if "PYTHONPATH" in os.environ:
            env_out["PYTHONPATH"] = os.environ["PYTHONPATH"]
        cap = DiskCap(binds, limits.disk_mb)
        # onto the capped binds, the files the command sees
        cap.mount_then(lambda: harness.hand_over(binds))

        def cleanup() -> None:
            try:
                self.remove(container)  # nothing writes the capped binds any more
            finally:
                cap.release()
            user.release()  # once the container, and every process of its user, is gone

        return Prepared(argv, env_out, cleanup)

    def remove(self, name: str) -> None:
        """Remove container ``name`` now, killing what runs in it; nothing if there is none."""
        try:
            with contextlib.suppress(NotFound):
                _remove(self._client.containers.get(name))
        except DockerException as exc:
            raise SandboxError(f"the Docker engine could not remove {name}: {_why(exc)}") from exc

    def has_image(self, image: str) -> bool:
        try:
            self._client.images.get(image)
        except ImageNotFound:
            return False
        except DockerException as exc:
            raise SandboxError(f"the Docker engine could not look up {image}: {_why(exc)}") from exc
        return True

    def image_id(self, image: str) -> str:
        try:
            return str(self._client.images.get(image).id).removeprefix("sha256:")
        except ImageNotFound:
            hint = f"; run {SETUP}" if image == BASE_IMAGE else ""
            raise SandboxError(f"image {image} is not present in the Docker engine{hint}") from None
        except DockerException as exc:
            raise SandboxError(f"the Docker engine could not look up {image}: {_why(exc)}") from exc

    def build(self, context: Path, dockerfile: str, tag: str) -> None:
        try:
            self._client.api.timeout = BUILD_TIMEOUT_S
            self._client.images.build(
                path=str(context), dockerfile=dockerfile, tag=tag, network_mode="none", pull=False, rm=True
            )
        except BuildError as exc:
            raise SandboxError(f"docker build of {tag} failed: {exc.msg}") from exc
        except (DockerException, requests.RequestException) as exc:
            raise SandboxError(f"docker build of {tag} failed: {_why(exc)}") from exc
        finally:
            self._client.api.timeout = API_TIMEOUT_S


def _probe(base_url: str) -> None:
    """Connect to a unix socket ``base_url`` once; raises OSError when nothing listens. (The SDK
    leaves its socket open when a connection fails.)"""
    if base_url.startswith("unix://"):
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(API_TIMEOUT_S)
            probe.connect(base_url.removeprefix("unix://"))


def _remove(container: Any) -> None:
    with contextlib.suppress(NotFound):
        container.remove(force=True)


def _why(exc: Exception) -> str:
    return str(getattr(exc, "explanation", None) or exc).strip().splitlines()[0][:300]


def attach(base_url: str, spec: dict[str, Any]) -> int:
    """Create and start the container ``spec`` describes, copy its output to ours, and return
    its exit status; on SIGTERM or SIGINT remove it (killing what runs in it) and return 143."""
    memory_mb, cpu_s, processes, file_size_mb = spec["limits"]
    binds = [Bind(Path(source), target, writable) for source, target, writable in spec["binds"]]
    name, route, user = spec["harness"]
    harness = Harness(
        name,
        None if route is None else ProxyRoute(Path(route[0]), route[1]),
        None if user is None else (int(user[0]), int(user[1])),
    )
    kwargs = create_kwargs(
        spec["image"],
        spec["command"],
        name=spec["name"],
        workdir=spec["workdir"],
        binds=binds,
        env=spec["env"],
        limits=Limits(memory_mb, cpu_s, processes, file_size_mb),
        harness=harness,
    )
    client = docker.DockerClient(base_url=base_url, version=API_VERSION, timeout=API_TIMEOUT_S)
    container = client.containers.create(**kwargs)

    def stop(signum: int, frame: FrameType | None) -> None:
        # Only raise: the ``finally`` below removes the container. A handler that itself called
        # the API could wait forever on a lock of the client's connection pool that the main
        # thread held when the signal came (the handler runs in that thread).
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        container.start()
        copies = [
            threading.Thread(target=_copy_output, args=(container, stdout), daemon=True)
            for stdout in (True, False)
        ]
        for thread in copies:
            thread.start()
        status = int(container.wait(timeout=None)["StatusCode"])
        for thread in copies:
            thread.join(timeout=API_TIMEOUT_S)
        return status
    finally:
        _remove(container)


def _copy_output(container: Any, stdout: bool) -> None:
    """Copy the container's stdout (or stderr) to ours as it comes, until it ends."""
    into = sys.stdout if stdout else sys.stderr
    for chunk in container.logs(stdout=stdout, stderr=not stdout, stream=True, follow=True):
        into.buffer.write(chunk)
        into.buffer.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre_train.sandbox.docker")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("attach", help="run one container to its end (DockerSandbox.prepare's command)")
    run.add_argument("base_url")
    run.add_argument("spec", help="the container, as JSON")
    args = parser.parse_args(argv)
    return attach(args.base_url, json.loads(args.spec))


if __name__ == "__main__":
    sys.exit(main())
