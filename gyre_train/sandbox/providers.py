"""Sandbox kinds by name: ``local``, ``bwrap``, ``podman`` and ``docker``. A kind whose engine is
missing says in one line what to run."""

from __future__ import annotations

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Sandbox
from gyre_train.sandbox.bwrap import BwrapSandbox
from gyre_train.sandbox.local import LocalSandbox
from gyre_train.sandbox.podman import PodmanSandbox

KINDS = ("local", "bwrap", "podman", "docker")


def sandbox_for(kind: str) -> Sandbox:
    """The sandbox of ``kind`` (a container kind runs the base image until a task's image is
    chosen: ``ContainerSandbox.image_for``); raises SandboxError for an unknown kind or one that
    cannot run here."""
    if kind == "local":
        return LocalSandbox()
    if kind == "bwrap":
        return BwrapSandbox()
    if kind == "podman":
        return PodmanSandbox()
    if kind == "docker":
        try:  # the Docker SDK is an optional dependency: only this kind needs it
            from gyre_train.sandbox.docker import DockerSandbox
        except ImportError as exc:
            raise SandboxError(
                f"the docker sandbox needs the docker SDK ({exc.msg}): pip install docker"
            ) from exc
        return DockerSandbox()
    raise SandboxError(f"unknown sandbox kind {kind!r}; known: {', '.join(KINDS)}")
