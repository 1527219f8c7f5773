"""The inputs of the decision core: small frozen, tagged structs, one per fact.

Dispatches and starts are decisions of the decision core itself (the paper's scheduler both
dispatches groups and starts executions), so only the world's answers arrive here.
Every input carries ``at``, seconds since the run started.
"""

from __future__ import annotations

import enum

import msgspec


class Outcome(enum.Enum):
    """How an execution terminated; every outcome advances f by one."""

    COMPLETED = "completed"
    HARNESS_TIMEOUT = "harness_timeout"  # still scored and trained on
    OVERALL_TIMEOUT = "overall_timeout"  # budget exhausted: no valid reward, discarded
    FAILED = "failed"
    CANCELLED = "cancelled"
    SURPLUS = "surplus"


class RunStarted(msgspec.Struct, frozen=True, tag=True):
    """The run begins: the decision core fills the queue to its target depth."""

    at: float


class ExecutionFinished(msgspec.Struct, frozen=True, tag=True):
    """One execution terminated (any outcome)."""

    at: float
    execution: int
    outcome: Outcome = Outcome.COMPLETED


class GroupReady(msgspec.Struct, frozen=True, tag=True):
    """All N executions of a group closed and were evaluated: the group can be trained."""

    at: float
    group: int


class BatchStarted(msgspec.Struct, frozen=True, tag=True):
    """The trainer opened batch ``step`` (0-based) and will fill it with B groups."""

    at: float
    step: int


class GroupClaimed(msgspec.Struct, frozen=True, tag=True):
    """The packing buffer took a ready group into batch ``step``."""

    at: float
    group: int
    step: int


class BatchClosed(msgspec.Struct, frozen=True, tag=True):
    """The optimizer update of batch ``step`` finished."""

    at: float
    step: int


class WeightsPublished(msgspec.Struct, frozen=True, tag=True):
    """The core published policy ``version`` (the number of updates so far) to every engine."""

    at: float
    version: int


class TransitionDone(msgspec.Struct, frozen=True, tag=True):
    """Cell ``cell`` finished the role change it began."""

    at: float
    cell: int


class ClockTick(msgspec.Struct, frozen=True, tag=True):
    """Time passed; lets the supply timer expire without any other event."""

    at: float


class PoolCapacityChanged(msgspec.Struct, frozen=True, tag=True):
    """The rollout pool's engines that registered, and still answer, hold ``capacity``
    executions at once: C_s from now on (an engine registered later counts from its
    registration; one lost with its machine leaves it)."""

    at: float
    capacity: int


Input = (
    RunStarted
    | ExecutionFinished
    | GroupReady
    | BatchStarted
    | GroupClaimed
    | BatchClosed
    | WeightsPublished
    | TransitionDone
    | ClockTick
    | PoolCapacityChanged
)

INPUT_TYPES: tuple[type[Input], ...] = (
    RunStarted,
    ExecutionFinished,
    GroupReady,
    BatchStarted,
    GroupClaimed,
    BatchClosed,
    WeightsPublished,
    TransitionDone,
    ClockTick,
    PoolCapacityChanged,
)
