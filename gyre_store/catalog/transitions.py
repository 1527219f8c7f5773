"""The event types of a live role transition: the controller's commands to a cell, the cell's
steps as each completes, and executions moved to another engine.

The controller's live sink appends a ``cell.command`` for every step of the paper's protocol
that a cell carries out, and an ``execution.rerouted`` for every execution it moves (the
proxy follows those and moves the execution's in-flight request itself, so a request is
cancelled only after its new route is known). The cell runtime carries out its commands in
log order and records ``cell.step_done`` as each one completes, with its seconds; its last
step of a transition is followed by ``cell.transition_done`` (catalog/run.py), the fact the
decision core waits for. The proxy records how each request in flight it moved continued
(``request.moved``: its KV cache migrated, or its context prefilled again).
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from gyre_store.catalog.registry import REGISTRY, Ident, NonNegative
from gyre_store.log.events import Event


class CellStep(enum.StrEnum):
    """A step of a role transition, named for the phase it is (in the paper's order)."""

    # rollout -> training
    DRAIN = "drain"  # the engine takes no new requests; in-flight ones go on
    REROUTE = "reroute"  # in-flight requests cancelled and retried on their new engines
    RELEASE = "release"  # the engine's weights, KV cache and buffers freed
    RESTORE = "restore"  # the training state restored
    JOIN = "join"  # in the open batch (a satellite has pulled the core's snapshot)
    # training -> rollout
    RELEASE_TRAINING = "release_training"  # gradients and training buffers freed
    RESTORE_ROLLOUT = "restore_rollout"  # the engine serves the newest policy again
    # the end-of-burst decision about the core, when it stays in training
    CORE_STAYS = "core_stays"


def cell_engine_name(run_id: str, cell: int) -> str:
    """The engine name cell ``cell``'s rollout engine registers under (``engine.registered``)."""
    return f"{run_id}:cell-{cell}"


TO_TRAINING_STEPS = (CellStep.DRAIN, CellStep.REROUTE, CellStep.RELEASE, CellStep.RESTORE, CellStep.JOIN)
TO_ROLLOUT_STEPS = (CellStep.RELEASE_TRAINING, CellStep.RESTORE_ROLLOUT)


@REGISTRY.register("cell.command", stream="cellcmd", key=("run_id", "cell_index"))
class CellCommand(Event, frozen=True, kw_only=True):
    """The controller asks cell ``cell_index`` to carry out ``step`` (it follows its commands
    in log order). ``transition`` is the scheduler's input number (``seq`` of its
    ``sched.input``) whose decisions began the transition: the commands of one transition,
    and the steps done for them, share it."""

    run_id: Ident
    cell_index: NonNegative
    step: CellStep
    transition: NonNegative
    reason: str = ""


@REGISTRY.register("cell.step_done", stream="cellcmd", key=("run_id", "cell_index"))
class CellStepDone(Event, frozen=True, kw_only=True):
    """Cell ``cell_index`` completed ``step`` of its transition ``transition`` in ``seconds``
    (for ``join``: ``batch``, the batch it joined)."""

    run_id: Ident
    cell_index: NonNegative
    step: CellStep
    transition: NonNegative
    seconds: Annotated[float, msgspec.Meta(ge=0)]
    detail: str = ""
    batch: NonNegative | None = None


@REGISTRY.register("execution.rerouted", stream="execution", key="execution_id")
class ExecutionRerouted(Event, frozen=True, kw_only=True):
    """The scheduler moved an execution to engine slot ``engine`` (``pool`` or ``cell-<i>``);
    its next request, and its request in flight, go there."""

    execution_id: Ident
    run_id: Ident
    engine: Ident


class MovePath(enum.StrEnum):
    """How a request in flight continued on its new engine."""

    KV_MIGRATION = "kv_migration"  # its KV cache moved: the destination prefilled only the rest
    REPREFILL = "reprefill"  # aborted, and its whole context prefilled again on the destination


@REGISTRY.register("request.moved", stream="execution", key="execution_id")
class RequestMoved(Event, frozen=True, kw_only=True):
    """The proxy moved request ``request_id`` of an execution the scheduler rerouted from engine
    ``source`` to ``destination``, by ``path``; ``kv_tokens`` positions of KV went with it
    (0 on re-prefill), ``detail`` says why KV did not move when it did not."""

    execution_id: Ident
    run_id: Ident
    request_id: Ident
    source: Ident
    destination: str = ""
    path: MovePath
    kv_tokens: NonNegative = 0
    detail: str = ""
