"""Built-in task families with verifiable rewards, small enough for a tiny model on a CPU.

A family makes task instances (``task.defined`` events: a prompt, the starting workspace, hidden
tests and the command that runs them) from a seed, with train and held-out instances disjoint
by construction, and the demonstration an expert agent would give for an instance (a short
supervised warm start trains on those). Every family's tests are one Python script that writes
a JUnit XML report, one test case per check, so partial work earns a partial reward.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gyre_store import TaskDefined, TaskSplit
from gyre_train.exceptions import InvalidConfigError

CHECK_COMMAND = ("{python}", "{tests}/check.py", "{report}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a demonstration and the result the harness would return."""

    name: str
    arguments: dict[str, str]
    result: str


@dataclass(frozen=True, slots=True)
class Demonstration:
    """What an expert agent does for one instance: tool calls, then a short final answer."""

    calls: tuple[ToolCall, ...]
    answer: str


@dataclass(frozen=True, slots=True)
class Instance:
    """One task instance as its family describes it.

    ``demonstrations`` maps a mode to what a demonstrator does: ``correct`` always, and flawed
    modes (partial or wrong work) that a warm start mixes in, like any imperfect demonstration
    set, so the starting policy passes sometimes and not always.
    """

    key: str  # identifies the instance within its family (decides the train/held-out split)
    prompt: str
    files: dict[str, str]
    tests: dict[str, str]
    demonstrations: dict[str, Demonstration]

    @property
    def demonstration(self) -> Demonstration:
        return self.demonstrations["correct"]


Maker = Callable[[random.Random], Instance]


def held_out(family: str, key: str, buckets: int = 8) -> bool:
    """Whether an instance belongs to the held-out split: a hash of its key, one bucket of eight."""
    return hashlib.sha256(f"{family}/{key}".encode()).digest()[0] % buckets == 0


def instances(
    family: str, make: Maker, *, count: int, split: TaskSplit, seed: int, distinct: bool = True
) -> list[Instance]:
    """``count`` instances of ``split`` drawn from ``seed`` (held-out: seed-independent); distinct
    unless ``distinct`` is False (a demonstration set may repeat an instance); none for 0."""
    if count == 0:
        return []
    rng = random.Random(f"{family}/{split.value}/{seed if split is TaskSplit.TRAIN else 0}")
    out: dict[str, Instance] = {}
    repeated: list[Instance] = []
    for _ in range(count * 200):
        candidate = make(rng)
        if held_out(family, candidate.key) != (split is TaskSplit.HELDOUT):
            continue
        if not distinct:
            repeated.append(candidate)
            if len(repeated) == count:
                return repeated
        elif candidate.key not in out:
            out[candidate.key] = candidate
            if len(out) == count:
                return list(out.values())
    raise InvalidConfigError(f"family {family!r} has fewer than {count} distinct {split.value} instances")


def defined(
    family: str, run_id: str, found: Sequence[Instance], split: TaskSplit, budget_s: float
) -> list[TaskDefined]:
    return [
        TaskDefined(
            run_id=run_id,
            task_id=f"{family}-{split.value}-{i}",
            split=split,
            prompt=inst.prompt,
            files=inst.files,
            tests=inst.tests,
            test_command=CHECK_COMMAND,
            budget_s=budget_s,
            family=family,
        )
        for i, inst in enumerate(found)
    ]
