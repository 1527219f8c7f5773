"""Sandbox kinds by name: ``local`` and ``bwrap`` today; ``podman`` and ``docker`` are named
so that choosing them says plainly that they are not built yet."""

from __future__ import annotations

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Sandbox
from gyre_train.sandbox.bwrap import BwrapSandbox
from gyre_train.sandbox.local import LocalSandbox

KINDS = ("local", "bwrap", "podman", "docker")
NOT_BUILT = ("podman", "docker")


def sandbox_for(kind: str) -> Sandbox:
    """The sandbox of ``kind``; raises SandboxError for one not built yet or unknown."""
    if kind == "local":
        return LocalSandbox()
    if kind == "bwrap":
        return BwrapSandbox()
    if kind in NOT_BUILT:
        raise SandboxError(f"sandbox kind {kind!r} is not implemented yet; use local or bwrap")
    raise SandboxError(f"unknown sandbox kind {kind!r}; known: {', '.join(KINDS)}")
