"""The scheduler's events in gyre_store: what it was told, what it decided, what it did.

Three kinds live on one stream per run (``sched:<run_id>``), so its gapless version
orders them and a second controller writing the same run fails on a version conflict:
``sched.configured`` (the SchedConfig, first), ``sched.input`` (one decision-core input, tagged,
with its ``seq``), ``sched.decision`` (one decision of input ``seq``, tagged) and
``sched.step`` (one protocol command carried out). ``sched.rejected`` notes a fact the
decision core refused. The world's facts (group ready, batches, transitions done) are gyre_store's
catalog types, written by the components that know them; ``fact_event`` and ``input_of``
map between facts and decision-core inputs. This module does no I/O.

The ``sched.*`` types are registered explicitly, by ``register_sched_events`` (which
importing ``gyre_sched`` calls, and so does every entry point that opens the store), never
as a side effect of importing this module.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from gyre_sched.config import SchedConfig
from gyre_sched.decision import (
    POOL,
    BatchClosed,
    BatchStarted,
    CellRole,
    ClockTick,
    Decision,
    Direction,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    Input,
    Outcome,
    PoolCapacityChanged,
    RunStarted,
    TransitionDone,
    WeightsPublished,
)
from gyre_sched.exceptions import StoreMappingError
from gyre_store import catalog
from gyre_store.log import Event, EventRegistry, RecordedEvent, StreamId

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]

SCHED_STREAM = "sched"


# -- the scheduler's own record ------------------------------------------------------------


class SchedConfigured(Event, frozen=True, kw_only=True):
    """The config the controller ran the decision core with; the first event of the stream."""

    run_id: Ident
    config: SchedConfig


class SchedInput(Event, frozen=True, kw_only=True):
    """Input number ``seq`` fed to the decision core; ``source_position`` is the fact it came from
    (None for a ClockTick, which the controller makes itself)."""

    run_id: Ident
    seq: NonNegative
    input: Input
    source_position: NonNegative | None = None


class SchedDecision(Event, frozen=True, kw_only=True):
    """Decision number ``index`` the decision core returned for input ``seq``."""

    run_id: Ident
    seq: NonNegative
    index: NonNegative
    decision: Decision


class ProtocolStep(enum.Enum):
    """One command of the ordered protocol; the value is the CommandSink method."""

    DISPATCH_GROUPS = "dispatch_groups"
    START_EXECUTIONS = "start_executions"
    STOP_ACCEPTING = "stop_accepting"
    RESERVE_CAPACITY = "reserve_capacity"
    UPDATE_ROUTING = "update_routing"
    CANCEL_AND_RETRY = "cancel_and_retry"
    RELEASE_ROLLOUT_MEMORY = "release_rollout_memory"
    RESTORE_TRAINING_STATE = "restore_training_state"
    RELEASE_TRAINING_MEMORY = "release_training_memory"
    RESTORE_ROLLOUT_ENGINE = "restore_rollout_engine"
    CORE_DECIDED = "core_decided"
    SCHEDULE_TICK = "schedule_tick"


class SchedStep(Event, frozen=True, kw_only=True):
    """Command number ``ordinal`` of input ``seq``, carried out for decision ``decision``.

    ``cell`` and ``direction`` are set for the steps of a transition; ``engine`` and
    ``count`` for a capacity reservation; ``count`` is otherwise the executions moved
    or started (0 when none).
    """

    run_id: Ident
    seq: NonNegative
    ordinal: NonNegative
    decision: NonNegative
    step: ProtocolStep
    cell: int | None = None
    direction: Direction | None = None
    engine: int | None = None
    count: NonNegative = 0


class SchedRejected(Event, frozen=True, kw_only=True):
    """The decision core refused the fact at ``source_position``; it changed no state."""

    run_id: Ident
    source_position: NonNegative
    input: Input
    reason: str


SCHED_EVENT_TYPES: tuple[tuple[str, type[Event]], ...] = (
    ("sched.configured", SchedConfigured),
    ("sched.input", SchedInput),
    ("sched.decision", SchedDecision),
    ("sched.step", SchedStep),
    ("sched.rejected", SchedRejected),
)
"""The scheduler's own event types, by name; all on the ``sched`` stream, keyed by run."""


def register_sched_events(registry: EventRegistry = catalog.REGISTRY) -> EventRegistry:
    """Register the ``sched.*`` event types in ``registry`` (the store's by default), once.

    Idempotent: registering again is a no-op. Raises ValueError if another type already
    holds one of the names. Returns the registry.
    """
    for name, cls in SCHED_EVENT_TYPES:
        if name in registry:
            if registry.type_of(name) is not cls:
                raise ValueError(f"event type {name!r} is registered to another class")
            continue
        registry.register(name, stream=SCHED_STREAM, key="run_id")(cls)
    return registry


FACT_TYPES: frozenset[str] = frozenset(
    {
        "run.started",
        "execution.finished",
        "group.ready",
        "batch.started",
        "batch.group_claimed",
        "batch.closed",
        "policy.published",
        "cell.transition_done",
    }
)
"""The store events that become decision-core inputs (what the controller subscribes to)."""


# -- naming: the store's string ids for the decision core's numbers ---------------------------------


def sched_stream(run_id: str) -> StreamId:
    """The stream holding a run's scheduler events."""
    return StreamId(SCHED_STREAM, run_id)


def execution_id(run_id: str, execution: int) -> str:
    """The store id of the decision core's execution number ``execution`` (group g holds g N .. g N + N - 1)."""
    return f"{run_id}/e{execution}"


def group_id(run_id: str, group: int) -> str:
    """The store id of the decision core's group number ``group``."""
    return f"{run_id}/g{group}"


def engine_name(engine: int) -> str:
    """The engine name written in ExecutionStarted: ``pool`` or ``cell-<index>``."""
    return "pool" if engine == POOL else f"cell-{engine}"


def _number(run_id: str, ident: str, kind: str) -> int:
    prefix = f"{run_id}/{kind}"
    digits = ident[len(prefix) :] if ident.startswith(prefix) else ""
    if not digits.isdigit():
        raise StoreMappingError(
            f"{ident!r} is not an id the scheduler of run {run_id!r} handed out (expected {prefix}<number>)"
        )
    return int(digits)


def execution_number(run_id: str, ident: str) -> int:
    """Inverse of ``execution_id``; raises StoreMappingError for a foreign id."""
    return _number(run_id, ident, "e")


def group_number(run_id: str, ident: str) -> int:
    """Inverse of ``group_id``; raises StoreMappingError for a foreign id."""
    return _number(run_id, ident, "g")


def engine_number(name: str) -> int:
    """Inverse of ``engine_name``; raises StoreMappingError for an unknown engine."""
    if name == "pool":
        return POOL
    digits = name.removeprefix("cell-")
    if name.startswith("cell-") and digits.isdigit():
        return int(digits)
    raise StoreMappingError(f"engine {name!r} is neither 'pool' nor 'cell-<index>'")


# -- facts <-> inputs -----------------------------------------------------------------------


def input_of(recorded: RecordedEvent, run_id: str, at: float) -> Input | None:
    """The decision-core input a store fact stands for, stamped ``at``; None when the fact belongs
    to another run or is not a scheduler input. Raises StoreMappingError on a foreign id."""
    ev = recorded.event
    if getattr(ev, "run_id", None) != run_id:
        return None
    match ev:
        case catalog.RunStarted():
            return RunStarted(at)
        case catalog.ExecutionFinished(execution_id=ident, reason=reason):
            return ExecutionFinished(at, execution_number(run_id, ident), Outcome(reason.value))
        case catalog.GroupReady(group_id=ident):
            return GroupReady(at, group_number(run_id, ident))
        case catalog.BatchStarted(step=step):
            return BatchStarted(at, step)
        case catalog.BatchGroupClaimed(step=step, group_id=ident):
            return GroupClaimed(at, group_number(run_id, ident), step)
        case catalog.BatchClosed(step=step):
            return BatchClosed(at, step)
        case catalog.WeightsPublished(policy_version=version):
            return WeightsPublished(at, version)
        case catalog.CellTransitionDone(cell_index=cell):
            return TransitionDone(at, cell)
    return None


def fact_event(run_id: str, event: Input, *, step: int = 0) -> Event | None:
    """The store fact a world component writes for ``event`` (inverse of ``input_of``);
    None for a ClockTick or a PoolCapacityChanged, which only the controller makes. ``step`` is the training step
    of a publication (policy.published records it)."""
    match event:
        case RunStarted():
            raise StoreMappingError(
                "run.started carries the run's shape; write it with gyre_store.RunStarted"
            )
        case ExecutionFinished(execution=execution, outcome=outcome):
            return catalog.ExecutionFinished(
                execution_id=execution_id(run_id, execution),
                run_id=run_id,
                reason=catalog.FinishReason(outcome.value),
            )
        case GroupReady(group=group):
            return catalog.GroupReady(group_id=group_id(run_id, group), run_id=run_id)
        case BatchStarted(step=batch):
            return catalog.BatchStarted(run_id=run_id, step=batch)
        case GroupClaimed(group=group, step=batch):
            return catalog.BatchGroupClaimed(run_id=run_id, step=batch, group_id=group_id(run_id, group))
        case BatchClosed(step=batch):
            return catalog.BatchClosed(run_id=run_id, step=batch)
        case WeightsPublished(version=version):
            return catalog.WeightsPublished(run_id=run_id, policy_version=version, step=step)
        case TransitionDone(cell=cell):
            return catalog.CellTransitionDone(run_id=run_id, cell_index=cell)
        case ClockTick() | PoolCapacityChanged():
            return None


def store_role(role: CellRole) -> catalog.CellRole:
    """The store's coarser role: both directions of a change read as ``transitioning``."""
    if role is CellRole.ROLLOUT:
        return catalog.CellRole.ROLLOUT
    if role is CellRole.TRAIN:
        return catalog.CellRole.TRAINING
    return catalog.CellRole.TRANSITIONING


# -- idempotency keys: one per recorded thing, so a retried append is a no-op ---------------


def config_key(run_id: str) -> str:
    return f"sched/{run_id}/config"


def input_key(run_id: str, seq: int) -> str:
    return f"sched/{run_id}/in/{seq}"


def decision_key(run_id: str, seq: int, index: int) -> str:
    return f"sched/{run_id}/dec/{seq}/{index}"


def role_key(run_id: str, seq: int, cell: int, nth: int) -> str:
    return f"sched/{run_id}/role/{seq}/{cell}/{nth}"


def step_key(run_id: str, seq: int, ordinal: int) -> str:
    return f"sched/{run_id}/step/{seq}/{ordinal}"


def rejected_key(run_id: str, source_position: int) -> str:
    return f"sched/{run_id}/rejected/{source_position}"
