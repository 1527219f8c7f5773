"""The core's side of streaming training: claim until nothing is left, plan, reduce, update.

When the core finds nothing left to claim it closes the join window, plans the reduction
(membership.py), reduces the prefix's gradients onto itself, makes the batch's one update, then
broadcasts to the prefix (non-final update of a burst) or publishes to the engines (final update),
recording ``policy.published`` with what the publisher measured of it where it measures.
A member that dies inside the reduction fails it; the core then waits out that member's heartbeat,
takes its claims over and plans again, counting the failed attempts in the update's event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gyre_store.catalog import (
    BatchClosed,
    CellRole,
    ContributionAccepted,
    TrainingUpdate,
    WeightsPublished,
    contribution_key,
)
from gyre_store.log import Event
from gyre_train.cells.cell import BurstPlan, Cell
from gyre_train.cells.local import merge_shares
from gyre_train.cells.membership import CORE, ReducePlan, TakeOver, Wait, plan_reduction
from gyre_train.cells.publish import WeightPublisher
from gyre_train.objective import ExecutionClip


@runtime_checkable
class RecordsPublication(Protocol):
    """A publisher that measured what each publication took: the ``policy.published`` event of
    version ``policy_version`` (the update of ``step``), with its figures."""

    def publication_event(self, policy_version: int, step: int) -> WeightsPublished: ...


@dataclass
class _CoreProgress:
    """What the core has accumulated of one batch, kept across reduction attempts."""

    held: dict[str, int] = field(default_factory=dict)
    clip: ExecutionClip | None = None
    loss: float = 0.0
    attempt: int = 0


def _core_batch(cell: Cell, batch: int, final: bool, progress: _CoreProgress) -> ReducePlan:
    """Claim and compute until every task is handed out, then plan the reduction."""
    queue, c = cell.queue(batch), cell.config
    held = progress.held
    while True:
        clip = progress.clip
        queue.renew(CORE, held)
        cell.replica.serve()
        task = queue.claim(CORE) or queue.reclaim(CORE)
        if task is not None:
            progress.loss += cell.process(queue, task, held, clip)
            continue
        if clip is None:
            manifest = queue.manifest()
            if manifest is not None and queue.ratio_count() == manifest.micro_steps:
                progress.clip = merge_shares(queue.ratio_shares(), manifest.summaries(), c.loss)
                queue.open_gradients(progress.clip)
            else:
                time.sleep(c.queue.poll_s)
            continue
        members = cell.board.close_window(batch)
        manifest = queue.manifest()
        assert manifest is not None  # the clip exists only for a closed batch
        decision = plan_reduction(
            batch=batch,
            micro_steps=manifest.micro_steps,
            members=members,
            alive=cell.board.alive(members),
            drained={k: v for k, v in cell.board.drained(batch).items() if k in members},
            core_held=held,
            pending=queue.pending(),
            final=final,
            attempt=progress.attempt,
        )
        if isinstance(decision, Wait):
            time.sleep(c.queue.poll_s)
            continue
        if isinstance(decision, TakeOver):
            for message_id in decision.message_ids:
                taken = queue.take_over(CORE, message_id)
                if taken is not None:
                    progress.loss += cell.process(queue, taken, held, clip)
            continue
        cell.board.put_plan(decision)
        return decision


def _reduce_on_core(cell: Cell, batch: int, final: bool) -> tuple[ReducePlan, float]:
    """Plan and reduce until a reduction succeeds; returns its plan and the batch loss.

    A member that dies after reporting drained (its heartbeat not yet expired) is in the plan
    and fails the collective. The core keeps its gradients (the reduction ran on a copy), waits
    out the dead member's heartbeat, takes its claims over and plans again (`attempt` + 1);
    live members wait for the newer plan instead of moving on.
    """
    progress = _CoreProgress()
    while True:
        plan = _core_batch(cell, batch, final, progress)
        loss = cell.replica.reduce(plan, progress.loss)
        if loss is not None:
            cell.board.put_reduced(batch, plan.attempt)
            return plan, loss
        progress.attempt += 1
        # Wait until a satellite of the failed plan is out (its heartbeat lapsed, at most
        # claim_timeout_s after it died), or the next plan names it again; renewing the core's
        # own claims and heartbeat meanwhile. Satellites that died together lapse within a
        # renewal of each other; one still counted alive fails the next attempt the same way.
        members = frozenset(plan.cells) - {CORE}
        deadline = time.monotonic() + cell.config.queue.claim_timeout_s
        while time.monotonic() < deadline and cell.board.alive(members) == members:
            cell.queue(batch).renew(CORE, progress.held)
            time.sleep(cell.config.queue.poll_s)


def _update(
    cell: Cell, batch: int, plan: ReducePlan, loss: float, final: bool, publisher: WeightPublisher | None
) -> None:
    """After a reduction counted: accept its contributions, update, then broadcast or publish."""
    c = cell.config
    cell.queue(batch).ack(plan.message_ids())
    contributions: list[Event] = []
    contribution_keys: list[str | None] = []
    for member, held in zip(plan.cells, plan.held, strict=True):
        for _, index in held:
            contributions.append(
                ContributionAccepted(
                    run_id=c.run_id, batch=batch, micro_step=index, cell=member, policy_version=cell.version
                )
            )
            contribution_keys.append(contribution_key(c.run_id, batch, index))
    cell.record(*contributions, keys=tuple(contribution_keys))
    if c.output_dir is not None:
        cell.replica.save_gradient(c.output_dir, cell.version + 1)
    norm = cell.replica.update()
    cell.version += 1
    cell.replica.expose(cell.version)
    if not final:
        cell.replica.broadcast(plan)
    elif publisher is not None:
        cell.replica.publish(publisher, cell.version)
    events: list[Event] = [
        TrainingUpdate(
            run_id=c.run_id,
            batch=batch,
            policy_version=cell.version,
            cells=list(plan.cells),
            dropped=list(plan.dropped),
            micro_steps=len(plan.message_ids()),
            loss=loss,
            grad_norm=norm,
            final=final,
            failed_reductions=plan.attempt,
        )
    ]
    keys: list[str | None] = [None]
    # The fact the scheduler's decision core counts: this step's optimizer update is done.
    events.append(BatchClosed(run_id=c.run_id, step=batch))
    keys.append(f"batch.closed:{c.run_id}/{batch}")
    if final and publisher is not None:
        # A publisher that measured its publication (LivePublisher) gives the event its figures.
        if isinstance(publisher, RecordsPublication):
            events.append(publisher.publication_event(cell.version, batch))
        else:
            events.append(WeightsPublished(run_id=c.run_id, policy_version=cell.version, step=batch))
        keys.append(f"published:{c.run_id}/{cell.version}")
    cell.record(*events, keys=tuple(keys))
    if c.output_dir is not None:
        cell.replica.save(c.output_dir, cell.version)
    cell.board.put_updated(batch, cell.version)


def run_core(
    cell: Cell,
    bursts: tuple[BurstPlan, ...],
    publisher: WeightPublisher | None,
    *,
    record_roles: bool = True,
    on_join: Callable[[int], None] | None = None,
) -> None:
    """Train every batch of `bursts` as the core; `publisher` gets the final update of each burst.

    `record_roles=False` leaves the cell's role changes to whoever decides them (a live run's
    controller records them), instead of recording them here; `on_join(batch)` is called once,
    when the core has opened its first batch."""
    cell.replica.expose(cell.version)
    in_training = not record_roles
    for burst in bursts:
        if not in_training:
            cell.role(CellRole.TRAINING, CellRole.ROLLOUT, "burst start")
            in_training = True
        for position, batch in enumerate(burst.batches):
            final = position == len(burst.batches) - 1
            cell.replica.zero_gradients()
            cell.board.open_batch(batch, cell.version)
            if on_join is not None:
                on_join(batch)
                on_join = None
            plan, loss = _reduce_on_core(cell, batch, final)
            _update(cell, batch, plan, loss, final, publisher)
        if not burst.core_stays and record_roles:
            cell.role(CellRole.ROLLOUT, CellRole.TRAINING, "burst end: core returns to rollout")
            in_training = False
