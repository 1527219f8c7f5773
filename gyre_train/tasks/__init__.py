"""The built-in task suite: families of small tasks with verifiable rewards (hidden tests that
score partial work), their train and held-out instances as ``task.defined`` events, and the
expert demonstrations a warm start trains on. Knows nothing of harnesses or engines.
"""

from __future__ import annotations

from gyre_train.tasks.families import DEMO_WEIGHTS, FAMILIES, family, task_suite
from gyre_train.tasks.suite import (
    CHECK_COMMAND,
    Demonstration,
    Instance,
    Maker,
    ToolCall,
    defined,
    held_out,
    instances,
)

__all__ = [
    "CHECK_COMMAND",
    "DEMO_WEIGHTS",
    "FAMILIES",
    "Demonstration",
    "Instance",
    "Maker",
    "ToolCall",
    "defined",
    "family",
    "held_out",
    "instances",
    "task_suite",
]
