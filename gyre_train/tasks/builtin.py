"""The built-in families as a task source: ``builtin:<family>`` (``builtin:copy-line``).

Instances are drawn as a run draws them (``instances``, split by the ``held_out`` hash rule).
The solution is the files the family's correct demonstration writes, copied into the workspace.
"""

from __future__ import annotations

from gyre_store import TaskSplit
from gyre_train.exceptions import TaskSourceError
from gyre_train.tasks.families import FAMILIES, family
from gyre_train.tasks.suite import CHECK_COMMAND, Instance, instances
from gyre_train.tasks.task import FileTree, Task

PREFIX = "builtin:"
SOLVE_COMMAND = ("cp", "-R", "{solution}/files/.", ".")


def read_builtin(
    spec: str, *, train: int = 8, heldout: int = 2, seed: int = 0, budget_s: float = 600.0
) -> list[Task]:
    """``train`` training and ``heldout`` held-out tasks of the family ``spec`` names."""
    name = spec.removeprefix(PREFIX)
    if name not in FAMILIES:
        raise TaskSourceError(
            f"{spec}: unknown builtin family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        )
    make = family(name)
    out: list[Task] = []
    for split, count in ((TaskSplit.TRAIN, train), (TaskSplit.HELDOUT, heldout)):
        for i, inst in enumerate(instances(name, make, count=count, split=split, seed=seed)):
            out.append(_task(spec, name, f"{name}-{split.value}-{i}", split, inst, budget_s))
    return out


def _task(spec: str, name: str, task_id: str, split: TaskSplit, inst: Instance, budget_s: float) -> Task:
    writes = {
        f"files/{call.arguments['file_path']}": call.arguments.get("content", "")
        for call in inst.demonstration.calls
        if call.name == "Write"
    }
    return Task(
        id=task_id,
        source=spec,
        kind="builtin",
        prompt=inst.prompt,
        split=split,
        workspace=FileTree(dict(inst.files)),
        tests=FileTree(dict(inst.tests)),
        test_command=CHECK_COMMAND,
        solution=FileTree(writes) if writes else None,
        solve_command=SOLVE_COMMAND if writes else (),
        agent_timeout_s=budget_s,
        verifier_timeout_s=budget_s,
        metadata={"family": name, "key": inst.key},
    )
