"""JSONL task files: one JSON object a line, for simple tasks.

Keys: ``id``, ``prompt``, ``test_command`` (a list of arguments, or a string run by ``sh -c``),
``budget_s``, and the starting workspace as ``files`` (path -> text) or ``repo`` and ``commit``
(a local git repository, relative to the file's folder, cloned at that commit); optionally
``tests`` (path -> text, the folder ``{tests}``), ``solution`` (a shell script run in the
workspace), ``split`` ("train" or "heldout"; else the hash rule of ``held_out``) and ``rubric``
(text an LLM judge scores the work against).
"""

from __future__ import annotations

import json
from pathlib import Path

from gyre_store import TaskSplit
from gyre_train.exceptions import TaskSourceError
from gyre_train.tasks.suite import held_out
from gyre_train.tasks.task import Files, FileTree, GitCheckout, Task

KEYS = frozenset(
    {
        "id",
        "prompt",
        "files",
        "repo",
        "commit",
        "test_command",
        "budget_s",
        "split",
        "tests",
        "solution",
        "rubric",
    }
)
SOLVE_COMMAND = ("sh", "{solution}/solve.sh")


def read_jsonl(path: Path) -> list[Task]:
    """Every task of ``path``; raises TaskSourceError naming the file, the line and the field."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TaskSourceError(f"{path}: cannot read: {exc.strerror}") from None
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(row, dict):
            raise TaskSourceError(f"{where}: a line must be a JSON object")
        task = _task(row, where, path)
        if task.id in seen:
            raise TaskSourceError(f"{where}: id {task.id!r} repeats an earlier line")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise TaskSourceError(f"{path}: no task (one JSON object a line)")
    return tasks


def _task(row: dict[str, object], where: str, path: Path) -> Task:
    unknown = sorted(set(row) - KEYS)
    if unknown:
        raise TaskSourceError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    task_id = _text(row, "id", where)
    prompt = _text(row, "prompt", where)
    workspace: Files
    if "files" in row:
        if "repo" in row or "commit" in row:
            raise TaskSourceError(f"{where}: files: give files, or repo and commit, not both")
        workspace = FileTree(_text_map(row, "files", where))
    elif "repo" in row:
        repo = (path.parent / _text(row, "repo", where)).resolve()
        if not (repo / ".git").exists() and not (repo / "HEAD").is_file():
            raise TaskSourceError(f"{where}: repo: {repo} is not a git repository")
        workspace = GitCheckout(repo, _text(row, "commit", where))
    else:
        raise TaskSourceError(f"{where}: files: missing (give files, or repo and commit)")
    command = row.get("test_command")
    if isinstance(command, str) and command.strip():
        test_command: tuple[str, ...] = ("sh", "-c", command)
    elif isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        test_command = tuple(command)
    else:
        raise TaskSourceError(f"{where}: test_command: missing or not a string or a list of strings")
    budget = row.get("budget_s")
    if isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0:
        raise TaskSourceError(f"{where}: budget_s: must be a positive number of seconds")
    split_raw = row.get("split")
    if split_raw is None:
        split = TaskSplit.HELDOUT if held_out(path.stem, task_id) else TaskSplit.TRAIN
    elif split_raw in ("train", "heldout"):
        split = TaskSplit(split_raw)
    else:
        raise TaskSourceError(f'{where}: split: {split_raw!r} is not "train" or "heldout"')
    rubric = row.get("rubric", "")
    if not isinstance(rubric, str):
        raise TaskSourceError(f"{where}: rubric: must be text")
    solution = row.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise TaskSourceError(f"{where}: solution: must be a shell script (a string)")
    return Task(
        id=task_id,
        source=str(path),
        kind="jsonl",
        prompt=prompt,
        split=split,
        workspace=workspace,
        tests=FileTree(_text_map(row, "tests", where) if "tests" in row else {}),
        test_command=test_command,
        solution=FileTree({"solve.sh": solution}) if solution is not None else None,
        solve_command=SOLVE_COMMAND if solution is not None else (),
        agent_timeout_s=float(budget),
        verifier_timeout_s=float(budget),
        rubric=rubric,
    )


def _text(row: dict[str, object], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value:
        raise TaskSourceError(f"{where}: {key}: missing or not a non-empty string")
    return value


def _text_map(row: dict[str, object], key: str, where: str) -> dict[str, str]:
    value = row.get(key)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TaskSourceError(f"{where}: {key}: must map file paths to text")
    for name in value:
        if Path(name).is_absolute() or ".." in Path(name).parts or not name:
            raise TaskSourceError(
                f"{where}: {key}: path {name!r} must be relative and stay inside its folder"
            )
    return value
