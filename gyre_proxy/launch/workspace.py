"""An execution's folders: a fresh workspace built from its task, a private HOME, the logs.

The workspace is where the harness works and what evaluators score afterwards: it is kept
as it was when the execution ended (preserved in place), and its artifact version is a
digest of its files, so an evaluation names exactly the state it saw. The task's tests are
not written here: the agent never sees them.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gyre_proxy.exceptions import LaunchError
from gyre_store.catalog import TaskDefined


@dataclass(frozen=True, slots=True)
class ExecutionDirs:
    """Where one execution lives on the launcher's machine."""

    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def harness_log(self) -> Path:
        return self.root / "harness.log"


def safe_name(execution_id: str) -> str:
    """A folder name for an execution id (ids may hold '/' and ':')."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in execution_id)


def prepare(
    root: Path,
    execution_id: str,
    task: TaskDefined,
    *,
    write: Callable[[TaskDefined, Path], None] | None = None,
) -> ExecutionDirs:
    """A fresh workspace for ``execution_id`` holding ``task``'s files (an old one is replaced).

    A task recorded by reference to its source (``task.source``) is written by ``write``.
    Raises LaunchError when a task file would land outside the workspace, or when the files
    cannot be written; the half-written workspace is then removed (nothing evaluable).
    """
    dirs = ExecutionDirs(root / safe_name(execution_id))
    if dirs.root.exists():
        shutil.rmtree(dirs.root)
    dirs.workspace.mkdir(parents=True)
    dirs.home.mkdir()
    if task.source:
        if write is None:
            shutil.rmtree(dirs.workspace)
            raise LaunchError(
                f"task {task.task_id} is read from {task.source}: this launcher cannot write it"
            )
        try:
            write(task, dirs.workspace)
        except LaunchError:
            shutil.rmtree(dirs.workspace, ignore_errors=True)
            raise
        return dirs
    for name, text in task.files.items():
        target = (dirs.workspace / name).resolve()
        if dirs.workspace.resolve() not in target.parents:
            raise LaunchError(f"task {task.task_id}: file {name!r} is outside the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return dirs


def artifact_version(workspace: Path) -> str:
    """A digest of every file under ``workspace`` (paths and contents), 16 hex digits."""
    digest = hashlib.sha256()
    if workspace.is_dir():
        for path in sorted(p for p in workspace.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(workspace)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
