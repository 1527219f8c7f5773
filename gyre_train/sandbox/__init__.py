"""Sandboxes: one provider interface (``Sandbox.run``) and one module per kind (``local``, a
process group on the host; ``bwrap``, bubblewrap namespaces). Knows nothing of tasks, runs, the
event log or training; containers (podman, docker) are not built yet.
"""

from __future__ import annotations

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Bind, Limits, Prepared, ProxyRoute, RunResult, Sandbox
from gyre_train.sandbox.bwrap import BwrapSandbox, bwrap_missing
from gyre_train.sandbox.local import LocalSandbox
from gyre_train.sandbox.providers import KINDS, sandbox_for

__all__ = [
    "KINDS",
    "Bind",
    "BwrapSandbox",
    "Limits",
    "LocalSandbox",
    "Prepared",
    "ProxyRoute",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "bwrap_missing",
    "sandbox_for",
]
