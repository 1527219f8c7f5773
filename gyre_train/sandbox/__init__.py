"""Sandboxes: one provider interface (``Sandbox.run`` for a command, ``Sandbox.prepare`` for a
long-running harness) and one module per kind: ``local``, a process group on the host; ``bwrap``,
bubblewrap namespaces; ``podman``, rootful podman containers; ``docker``, the Docker Engine API
(``gyre_train.sandbox.docker``, imported by ``sandbox_for`` since it needs the docker SDK).
``disk`` caps the total the confined kinds' writable binds hold; ``users`` is the unprivileged
user they run a harness as (every bwrap command).
The proxy is reached from inside through a ``UnixRelay``. Knows nothing of tasks, runs, the event
log or training.
"""

from __future__ import annotations

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Bind, Limits, Prepared, ProxyRoute, RunResult, Sandbox
from gyre_train.sandbox.bwrap import BwrapSandbox, bwrap_missing
from gyre_train.sandbox.disk import DiskCap
from gyre_train.sandbox.images import BASE_IMAGE, ContainerSandbox
from gyre_train.sandbox.local import LocalSandbox
from gyre_train.sandbox.podman import PodmanSandbox, podman_missing
from gyre_train.sandbox.providers import KINDS, sandbox_for
from gyre_train.sandbox.relay import UnixRelay

__all__ = [
    "BASE_IMAGE",
    "KINDS",
    "Bind",
    "BwrapSandbox",
    "ContainerSandbox",
    "DiskCap",
    "Limits",
    "LocalSandbox",
    "PodmanSandbox",
    "Prepared",
    "ProxyRoute",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "UnixRelay",
    "bwrap_missing",
    "podman_missing",
    "sandbox_for",
]
