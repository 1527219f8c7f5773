"""A task source from its string: a folder of Harbor tasks (or one task folder), a ``.jsonl``
file, or ``builtin:<family>``. Every source yields the same ``Task``; reading one runs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre_train.exceptions import TaskSourceError
from gyre_train.tasks.builtin import PREFIX, read_builtin
from gyre_train.tasks.harbor import read_harbor
from gyre_train.tasks.jsonl import read_jsonl
from gyre_train.tasks.task import Task


@dataclass(frozen=True, slots=True)
class TaskSource:
    """The tasks one source string names, in the source's order."""

    spec: str
    kind: str  # "harbor" | "jsonl" | "builtin"
    tasks: tuple[Task, ...]

    def task(self, task_id: str) -> Task:
        """The task ``task_id``; raises TaskSourceError naming the source when there is none."""
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise TaskSourceError(f"{self.spec}: no task {task_id!r} (gyre tasks list {self.spec} lists them)")


def open_source(spec: str) -> TaskSource:
    """Read the source ``spec`` names; raises TaskSourceError (one line, file and field named)."""
    if spec.startswith(PREFIX):
        return TaskSource(spec, "builtin", tuple(read_builtin(spec)))
    path = Path(spec)
    if path.suffix == ".jsonl":
        return TaskSource(spec, "jsonl", tuple(read_jsonl(path)))
    if path.is_dir():
        return TaskSource(spec, "harbor", tuple(read_harbor(path)))
    if not path.exists():
        raise TaskSourceError(
            f"{spec}: no such folder or file (a Harbor folder, a .jsonl file or builtin:<family>)"
        )
    raise TaskSourceError(f"{spec}: not a folder of Harbor tasks, a .jsonl file or builtin:<family>")
