"""Where an execution's harness runs and where its workspace comes from, when the launcher is
not left to its defaults (the harness on the host, the workspace from the files in its
``task.defined`` event).

A ``Placement`` is supplied by whoever starts the launcher (``gyre launcher serve`` builds one
from the run's ``[sandbox]``): it writes a workspace for a task that is recorded by reference to
its source, says where the workspace and HOME appear to the harness, and turns the harness's
command into one that runs in a sandbox. This package imports no sandbox: it only calls these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gyre_proxy.harness import LaunchSpec
from gyre_proxy.launch.workspace import ExecutionDirs
from gyre_store import TaskDefined

# Where a sandboxed harness finds its execution's snapshots folder, writable (``place`` binds
# ``<execution folder>/snapshots`` there when it exists), for ``.gyre/evaluate``.
SANDBOX_SNAPSHOTS = "/gyre/snapshots"


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Placed:
    """The process that runs a harness in its sandbox: ``argv`` with exactly ``env`` (its own
    process group), and ``cleanup`` to call once it ended or was killed."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cleanup: Callable[[], None] = _nothing


class Placement(Protocol):
    """Workspaces from task sources, and harnesses in sandboxes (see the module docstring)."""

    @property
    def sandboxed(self) -> bool:
        """Whether harnesses run in a sandbox (``place``) rather than on the host."""
        ...

    def write_workspace(self, task: TaskDefined, workspace: Path) -> None:
        """Write ``task``'s starting workspace into the empty folder ``workspace``; raises
        LaunchError (one line) when it cannot."""
        ...

    def inside(self, task: TaskDefined, dirs: ExecutionDirs) -> tuple[Path, Path]:
        """The workspace and HOME as the harness sees them."""
        ...

    def place(self, spec: LaunchSpec, task: TaskDefined, dirs: ExecutionDirs, name: str) -> Placed:
        """The sandboxed process that runs ``spec`` (its argv, env and nothing of the
        launcher's environment); raises LaunchError when the sandbox cannot be prepared."""
        ...
