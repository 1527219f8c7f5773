"""The built-in families by name, and a run's task definitions drawn from one of them."""

from __future__ import annotations

from gyre_store import TaskDefined, TaskSplit
from gyre_train.exceptions import InvalidConfigError
from gyre_train.tasks import copy_line
from gyre_train.tasks.suite import Maker, defined, instances

FAMILIES: dict[str, Maker] = {"copy-line": copy_line.make}
"""Family name -> its instance maker."""

DEMO_WEIGHTS: dict[str, dict[str, float]] = {"copy-line": copy_line.DEMO_WEIGHTS}
"""Family name -> the warm start's mix of demonstration modes."""


def family(name: str) -> Maker:
    """The maker of family ``name``; raises InvalidConfigError for an unknown one."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise InvalidConfigError(
            f"unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        ) from None


def task_suite(
    name: str, run_id: str, *, train: int, heldout: int, seed: int, budget_s: float
) -> list[TaskDefined]:
    """The run's task definitions: ``train`` training and ``heldout`` held-out instances."""
    make = family(name)
    found_train = instances(name, make, count=train, split=TaskSplit.TRAIN, seed=seed)
    found_heldout = instances(name, make, count=heldout, split=TaskSplit.HELDOUT, seed=seed)
    return [
        *defined(name, run_id, found_train, TaskSplit.TRAIN, budget_s),
        *defined(name, run_id, found_heldout, TaskSplit.HELDOUT, budget_s),
    ]
