"""The task definition every source produces: a prompt, a starting workspace written from the
task's own files (binary files and git repositories included, never embedded in event JSON), the
tests and the optional solution, timeouts, resources and the environment's image or Dockerfile.

It does not run anything: ``gyre_train.tasks.check`` runs tests and solutions in a sandbox.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gyre_store import TaskSplit
from gyre_train.exceptions import TaskSourceError

DEFAULT_WORKDIR = "/app"  # Harbor's convention where a Dockerfile names no WORKDIR


@dataclass(frozen=True, slots=True)
class FileTree:
    """Files written from text or bytes held in memory: ``path -> content``."""

    files: Mapping[str, str | bytes]
    executable: frozenset[str] = frozenset()

    def materialize(self, dest: Path) -> None:
        for name, content in self.files.items():
            target = _inside(dest, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
            if name in self.executable:
                target.chmod(0o755)

    def names(self) -> list[str]:
        return sorted(self.files)


@dataclass(frozen=True, slots=True)
class CopiedTree:
    """Files copied from the task's folder: ``(host source, destination relative to dest)``; a
    source folder's contents go under its destination, as Docker's COPY does."""

    copies: tuple[tuple[Path, str], ...]

    def materialize(self, dest: Path) -> None:
        for source, target in self.copies:
            to = _inside(dest, target) if target not in ("", ".") else dest
            if source.is_dir():
                shutil.copytree(source, to, dirs_exist_ok=True, symlinks=True)
            else:
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, to)

    def names(self) -> list[str]:
        out: list[str] = []
        for source, target in self.copies:
            if source.is_dir():
                out += [str(Path(target, p.relative_to(source))) for p in source.rglob("*") if p.is_file()]
            else:
                out.append(target)
        return sorted(os.path.normpath(n) for n in out)


@dataclass(frozen=True, slots=True)
class GitCheckout:
    """A local git repository cloned at ``commit``."""

    repo: Path
    commit: str

    def materialize(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for argv in (
            ["git", "clone", "--quiet", "--no-checkout", str(self.repo), str(dest)],
            ["git", "-C", str(dest), "checkout", "--quiet", "--detach", self.commit],
        ):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                detail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                raise TaskSourceError(f"{self.repo}: repo/commit {self.commit!r}: {detail[0]}")

    def names(self) -> list[str]:
        done = subprocess.run(
            ["git", "-C", str(self.repo), "ls-tree", "-r", "--name-only", self.commit],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise TaskSourceError(f"{self.repo}: commit {self.commit!r} not found")
        return done.stdout.split()


Files = FileTree | CopiedTree | GitCheckout


@dataclass(frozen=True, slots=True)
class Resources:
    """What a task asks of its environment (None: the sandbox's default)."""

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None


@dataclass(frozen=True)
class Task:
    """One task, as every source describes it.

    ``test_command`` and ``solve_command`` may name ``{tests}``, ``{solution}``, ``{logs}`` (the
    verifier's log folder, where ``reward.txt`` or ``reward.json`` goes), ``{report}`` (a JUnit
    XML report) and ``{python}``; the sandbox decides what each becomes. ``fixed_paths``: the
    task's scripts use absolute paths (``/tests``, ``/logs/verifier``, ``workdir``), as Harbor's do.
    """

    id: str
    source: str
    kind: str  # "harbor" | "jsonl" | "builtin"
    prompt: str
    split: TaskSplit
    workspace: Files
    tests: Files
    test_command: tuple[str, ...]
    solution: Files | None = None
    solve_command: tuple[str, ...] = ()
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    resources: Resources = field(default_factory=Resources)
    image: str | None = None
    dockerfile: Path | None = None
    unsupported: tuple[tuple[int, str], ...] = ()  # Dockerfile (line, instruction) bwrap cannot apply
    workdir: str = DEFAULT_WORKDIR
    env: Mapping[str, str] = field(default_factory=dict)
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    fixed_paths: bool = False
    metadata: Mapping[str, object] = field(default_factory=dict)
    rubric: str = ""  # what an LLM judge scores the work against (never shown to the agent)

    def materialize(self, dest: Path) -> None:
        """Write the starting workspace into ``dest`` (created if missing)."""
        dest.mkdir(parents=True, exist_ok=True)
        self.workspace.materialize(dest)

    @cached_property
    def workspace_hash(self) -> str:
        """``sha256:<hex>`` of the starting workspace: every file's path, executable bit and bytes
        (a git checkout: its commit's tree id, which is a content hash already)."""
        if isinstance(self.workspace, GitCheckout):
            done = subprocess.run(
                ["git", "-C", str(self.workspace.repo), "rev-parse", f"{self.workspace.commit}^{{tree}}"],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise TaskSourceError(
                    f"{self.source}: task {self.id}: commit {self.workspace.commit!r} not found"
                )
            return f"git-tree:{done.stdout.strip()}"
        with tempfile.TemporaryDirectory(prefix="gyre-task-hash-") as scratch:
            self.materialize(Path(scratch))
            return tree_hash(Path(scratch))


def tree_hash(root: Path) -> str:
    """``sha256:<hex>`` over every regular file under ``root``: path, executable bit, content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts):
        rel = path.relative_to(root).as_posix()
        executable = "x" if os.access(path, os.X_OK) else "-"
        digest.update(f"{len(rel)}:{rel}{executable}".encode())
        data = path.read_bytes()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return f"sha256:{digest.hexdigest()}"


def _inside(dest: Path, name: str) -> Path:
    """``dest / name``, refusing a name that is absolute or climbs out of ``dest``."""
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise TaskSourceError(f"file name {name!r} must be relative and stay inside the workspace")
    return dest / name
