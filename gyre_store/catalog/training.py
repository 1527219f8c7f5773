"""Events of streaming training: joins, micro-step claims and computations, accepted contributions,
updates.

A contribution is recorded by the core when a micro-step's gradient is in the reduced batch
gradient, under the idempotency key of (run, batch, micro-step): the log holds at most one per
micro-step, whichever cell computed it and however often its claim was delivered. Claims are
recorded by the claiming cell, so a takeover after a crash shows as a second delivery.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gyre_store.catalog.registry import REGISTRY, Ident, NonNegative, Positive
from gyre_store.log import Event

TRAIN_STREAM = "train"
Phase = Annotated[int, msgspec.Meta(ge=1, le=2)]


def contribution_key(run_id: str, batch: int, micro_step: int) -> str:
    """The idempotency key of a micro-step's contribution to its batch."""
    return f"train.contribution/{run_id}/{batch}/{micro_step}"


@REGISTRY.register("train.cell_joined", stream=TRAIN_STREAM, key=("run_id", "batch"))
class CellJoinedBatch(Event, frozen=True, kw_only=True):
    run_id: Ident
    batch: NonNegative
    cell: NonNegative  # 0 is the core
    policy_version: NonNegative  # the snapshot the cell trains from
    claims_before: NonNegative  # first deliveries of the batch handed out before the join
    transport: str


@REGISTRY.register("train.claimed", stream=TRAIN_STREAM, key=("run_id", "batch"))
class MicroStepClaimed(Event, frozen=True, kw_only=True):
    run_id: Ident
    batch: NonNegative
    micro_step: NonNegative
    phase: Phase  # 1: pass-1 share, 2: gradient
    cell: NonNegative
    deliveries: Positive  # above 1 after a takeover of a dead cell's claim


@REGISTRY.register("train.computed", stream=TRAIN_STREAM, key=("run_id", "batch"))
class MicroStepComputed(Event, frozen=True, kw_only=True):
    """A cell finished computing a claimed task: pass 1's forward or pass 2's forward-backward.

    ``seconds`` is the cell's wall time inside the model for it (loading the micro-step and
    queue traffic excluded); the run's useful-work figures sum it per cell.
    """

    run_id: Ident
    batch: NonNegative
    micro_step: NonNegative
    phase: Phase
    cell: NonNegative
    seconds: Annotated[float, msgspec.Meta(ge=0)]
    tokens: NonNegative


@REGISTRY.register("train.contribution", stream=TRAIN_STREAM, key=("run_id", "batch"))
class ContributionAccepted(Event, frozen=True, kw_only=True):
    run_id: Ident
    batch: NonNegative
    micro_step: NonNegative
    cell: NonNegative
    policy_version: NonNegative  # the weights the gradient was computed with


@REGISTRY.register("train.update", stream=TRAIN_STREAM, key=("run_id", "batch"))
class TrainingUpdate(Event, frozen=True, kw_only=True):
    run_id: Ident
    batch: NonNegative
    policy_version: Positive  # the version the update produced
    cells: list[int]  # the prefix that reduced its gradients
    dropped: list[int] = msgspec.field(default_factory=list)
    micro_steps: NonNegative
    loss: float
    grad_norm: float
    final: bool  # the burst's last update: published to the engines, not broadcast
    failed_reductions: NonNegative = 0  # reductions a member died inside before this one counted


@REGISTRY.register("batch.started", stream="batch", key=("run_id", "step"))
class BatchStarted(Event, frozen=True, kw_only=True):
    """The trainer opened batch ``step``."""

    run_id: Ident
    step: NonNegative


@REGISTRY.register("batch.group_claimed", stream="batch", key=("run_id", "step"))
class BatchGroupClaimed(Event, frozen=True, kw_only=True):
    """The packing buffer took a ready group into batch ``step``."""

    run_id: Ident
    step: NonNegative
    group_id: Ident


@REGISTRY.register("batch.closed", stream="batch", key=("run_id", "step"))
class BatchClosed(Event, frozen=True, kw_only=True):
    """The optimizer update of batch ``step`` finished."""

    run_id: Ident
    step: NonNegative
