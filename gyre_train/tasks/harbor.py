"""Harbor task directories: a folder of tasks (each subfolder one task), or one task folder.

A task folder holds ``task.toml`` (``[agent] timeout_sec``, ``[verifier] timeout_sec`` and
``env``, ``[environment]`` ``cpus``, ``memory`` ("2G") or ``memory_mb``, ``storage`` or
``storage_mb``, ``docker_image``; ``[metadata]`` free-form), ``instruction.md`` (the prompt),
``environment/`` (a Dockerfile and its build context), ``tests/test.sh`` (executable; writes
``/logs/verifier/reward.txt`` or ``reward.json``) and optionally ``solution/solve.sh`` and
``rubric.md`` (what an LLM judge scores the work against; the agent never sees it).

The starting workspace is what the Dockerfile's COPY and ADD put under its final WORKDIR; with no
Dockerfile, the files of ``environment/`` themselves. Keys inside a section that gyre does not
read are kept in the task's metadata, not refused: Harbor adds them over time.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gyre_store import TaskSplit
from gyre_train.exceptions import TaskSourceError
from gyre_train.tasks.dockerfile import read_dockerfile
from gyre_train.tasks.suite import held_out
from gyre_train.tasks.task import DEFAULT_WORKDIR, CopiedTree, Resources, Task

TOP_LEVEL_KEYS = frozenset(
    {"version", "schema_version", "task", "metadata", "verifier", "agent", "environment", "solution"}
)
NOT_WORKSPACE = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"})
DEFAULT_TIMEOUT_S = 600.0
TEST_COMMAND = ("{tests}/test.sh",)
SOLVE_COMMAND = ("bash", "{solution}/solve.sh")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B|I)?\s*$", re.IGNORECASE)


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def read_harbor(root: Path) -> list[Task]:
    """Every task under ``root`` (``root`` itself when it holds ``task.toml``), by folder name."""
    if not root.is_dir():
        raise TaskSourceError(f"{root}: not a folder of Harbor tasks")
    if is_task_dir(root):
        return [read_task(root, family=root.parent.name or "harbor")]
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    tasks = [
        read_task(p, family=root.name) for p in folders if is_task_dir(p) or (p / "instruction.md").exists()
    ]
    if not tasks:
        raise TaskSourceError(f"{root}: no task folder (a subfolder with task.toml) found")
    return tasks


def read_task(folder: Path, *, family: str) -> Task:
    """One Harbor task folder; raises TaskSourceError naming the file and the field."""
    toml_path = folder / "task.toml"
    if not toml_path.is_file():
        raise TaskSourceError(f"{toml_path}: missing (every Harbor task has a task.toml)")
    try:
        config = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskSourceError(f"{toml_path}: not valid TOML: {exc}") from None
    unknown = sorted(set(config) - TOP_LEVEL_KEYS)
    if unknown:
        raise TaskSourceError(
            f"{toml_path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(TOP_LEVEL_KEYS))})"
        )
    agent = _table(config, "agent", toml_path)
    verifier = _table(config, "verifier", toml_path)
    environment = _table(config, "environment", toml_path)
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise TaskSourceError(f"{instruction}: missing (instruction.md is the task's prompt)")
    test_sh = folder / "tests" / "test.sh"
    if not test_sh.is_file():
        raise TaskSourceError(f"{test_sh}: missing (tests/test.sh runs the task's tests)")
    if not os.access(test_sh, os.X_OK):
        raise TaskSourceError(f"{test_sh}: not executable (chmod +x it)")
    solve_sh = folder / "solution" / "solve.sh"
    env_dir = folder / "environment"
    dockerfile = env_dir / "Dockerfile"
    image = _optional(environment, "docker_image", str, toml_path, "environment")
    workdir, env = DEFAULT_WORKDIR, {}
    unsupported: tuple[tuple[int, str], ...] = ()
    if dockerfile.is_file():
        plan = read_dockerfile(dockerfile)
        workspace = CopiedTree(plan.copies)
        workdir, env, unsupported = plan.workdir, plan.env, plan.unsupported
        image = image or plan.image
    elif env_dir.is_dir():
        workspace = CopiedTree(
            tuple((p, p.name) for p in sorted(env_dir.iterdir()) if p.name not in NOT_WORKSPACE)
        )
    else:
        workspace = CopiedTree(())
    cpus = _optional(environment, "cpus", (int, float), toml_path, "environment")
    verifier_env = _optional(verifier, "env", dict, toml_path, "verifier") or {}
    return Task(
        id=folder.name,
        source=str(folder),
        kind="harbor",
        prompt=instruction.read_text(),
        split=TaskSplit.HELDOUT if held_out(family, folder.name) else TaskSplit.TRAIN,
        workspace=workspace,
        tests=CopiedTree(((folder / "tests", "."),)),
        test_command=TEST_COMMAND,
        solution=CopiedTree(((folder / "solution", "."),)) if solve_sh.is_file() else None,
        solve_command=SOLVE_COMMAND if solve_sh.is_file() else (),
        agent_timeout_s=_timeout(agent, toml_path, "agent"),
        verifier_timeout_s=_timeout(verifier, toml_path, "verifier"),
        resources=Resources(
            cpus=float(cpus) if cpus is not None else None,
            memory_mb=_megabytes(environment, "memory", toml_path),
            storage_mb=_megabytes(environment, "storage", toml_path),
        ),
        image=image,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        unsupported=unsupported,
        workdir=workdir,
        env=env,
        verifier_env={str(k): str(v) for k, v in verifier_env.items()},
        fixed_paths=True,
        metadata=dict(_table(config, "metadata", toml_path)) | {"task": config.get("task", {})},
        rubric=(folder / "rubric.md").read_text() if (folder / "rubric.md").is_file() else "",
    )


def _table(config: Mapping[str, object], key: str, where: Path) -> Mapping[str, object]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise TaskSourceError(f"{where}: [{key}] must be a table")
    return value


def _optional(
    table: Mapping[str, object], key: str, kind: type | tuple[type, ...], where: Path, section: str
) -> Any:
    """``table[key]`` if it is a ``kind`` (bools never count as numbers), None if absent."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TaskSourceError(f"{where}: [{section}] {key} has the wrong type ({type(value).__name__})")
    return value


def _timeout(table: Mapping[str, object], where: Path, section: str) -> float:
    value = _optional(table, "timeout_sec", (int, float), where, section)
    if value is None:
        return DEFAULT_TIMEOUT_S
    if value <= 0:
        raise TaskSourceError(f"{where}: [{section}] timeout_sec must be positive, got {value}")
    return float(value)


def _megabytes(table: Mapping[str, object], key: str, where: Path) -> int | None:
    """``key`` ("2G", "512M", a number of bytes) or ``key_mb`` (megabytes), in megabytes."""
    mb = _optional(table, f"{key}_mb", (int, float), where, "environment")
    if mb is not None:
        if mb <= 0:
            raise TaskSourceError(f"{where}: [environment] {key}_mb must be positive, got {mb}")
        return int(mb)
    raw = table.get(key)
    if raw is None:
        return None
    match = _SIZE.match(str(raw))
    if match is None or isinstance(raw, bool):
        raise TaskSourceError(f'{where}: [environment] {key} = {raw!r} is not a size such as "2G" or "512M"')
    number, unit = float(match.group(1)), match.group(2).upper()
    scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[unit]
    return max(1, int(number * scale))
