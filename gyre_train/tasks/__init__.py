"""The built-in task suite: families of small tasks with verifiable rewards (hidden tests that
score partial work), their train and held-out instances as ``task.defined`` events, and the
expert demonstrations a warm start trains on; and task sources (Harbor task directories, JSONL
files, ``builtin:<family>``) that all produce the same ``Task``, checked against Harbor's contract
in a sandbox. Knows nothing of harnesses or engines.
"""

from __future__ import annotations

from gyre_train.exceptions import TaskSourceError
from gyre_train.tasks.check import (
    CheckResult,
    Verdict,
    check_or_error,
    check_task,
    limits_for,
    read_reward,
    refusal,
    sandbox_for_task,
)
from gyre_train.tasks.families import DEMO_WEIGHTS, FAMILIES, family, task_suite
from gyre_train.tasks.runtime import (
    SandboxTestEvaluator,
    TaskFiles,
    TestRun,
    defined_tasks,
    event_task,
    run_tests,
)
from gyre_train.tasks.sources import TaskSource, open_source
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
from gyre_train.tasks.task import (
    DEFAULT_WORKDIR,
    CopiedTree,
    FileTree,
    GitCheckout,
    Resources,
    Task,
    tree_hash,
)

__all__ = [
    "CHECK_COMMAND",
    "DEFAULT_WORKDIR",
    "DEMO_WEIGHTS",
    "FAMILIES",
    "CheckResult",
    "CopiedTree",
    "Demonstration",
    "FileTree",
    "GitCheckout",
    "Instance",
    "Maker",
    "Resources",
    "SandboxTestEvaluator",
    "Task",
    "TaskFiles",
    "TaskSource",
    "TaskSourceError",
    "TestRun",
    "ToolCall",
    "Verdict",
    "check_or_error",
    "check_task",
    "defined",
    "defined_tasks",
    "event_task",
    "family",
    "held_out",
    "instances",
    "limits_for",
    "open_source",
    "read_reward",
    "refusal",
    "run_tests",
    "sandbox_for_task",
    "task_suite",
    "tree_hash",
]
