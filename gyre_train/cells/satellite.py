"""A satellite's side of streaming training: join a batch in flight, claim, drain, reduce.

A satellite joins a burst's batch once the given number of claims of it were handed out: it
renews its heartbeat, registers on the board (refused once the core closed the join window, then
it tries the next batch), pulls the core's snapshot if it does not hold that version, and claims
until every task is handed out. Then it reports what it holds, takes part in the reduction the
core plans, and waits for the core's confirmation or a newer plan; it returns to rollout at the
burst end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from gyre_store.catalog import CellJoinedBatch, CellRole
from gyre_train.cells.cell import BurstPlan, Cell
from gyre_train.cells.claims import MicroStepQueue, Phase
from gyre_train.cells.membership import ReducePlan


def _satellite_batch(cell: Cell, batch: int) -> tuple[ReducePlan, float]:
    """Claim until every task is handed out, report what this cell holds, wait for the plan."""
    queue, c = cell.queue(batch), cell.config
    held: dict[str, int] = {}
    loss = 0.0
    while cell.board.plan(batch) is None:
        queue.renew(c.cell, held)
        # Read before claiming: the clip is stored with every gradient task, so a clip seen
        # before an empty claim means all of them are handed out. Read after it, pass 2 may have
        # opened in between, and this cell would drain without claiming any of its tasks.
        opened = queue.clip() is not None
        task = queue.claim(c.cell) or queue.reclaim(c.cell)
        if task is not None:
            loss += cell.process(queue, task, held, queue.clip() if task.phase is Phase.GRADIENTS else None)
            continue
        if opened:
            break  # every gradient task is handed out: this cell has drained
        time.sleep(c.queue.poll_s)
    cell.board.report_drained(batch, c.cell, held)

    return _next_plan(cell, batch, held, -1), loss


def _next_plan(cell: Cell, batch: int, held: dict[str, int], after: int) -> ReducePlan:
    """The batch's plan newer than attempt `after`, renewing this cell's claims meanwhile (they
    must not look like a dead cell's)."""
    queue = cell.queue(batch)

    def plan_or_renew() -> ReducePlan | None:
        queue.renew(cell.config.cell, held)
        plan = cell.board.plan(batch)
        return plan if plan is not None and plan.attempt > after else None

    return cell.wait_for(f"plan of batch {batch} after attempt {after}", plan_or_renew)


def _reduce_on_satellite(cell: Cell, batch: int, plan: ReducePlan, loss: float) -> ReducePlan:
    """Take part in the plan's reduction until the core confirms one; returns the plan that
    counted. A reduction that failed here or on the core is followed by a newer plan, which
    may leave this cell out (then its gradients are discarded)."""
    me = cell.config.cell
    held = dict(plan.held[plan.cells.index(me)])
    while me in plan.cells:
        cell.replica.reduce(plan, loss)
        # Whether it failed here or not, only the core knows whether the reduction counted.
        newer = _reduced_or_newer(cell, batch, held, plan.attempt)
        if newer is None:
            return plan
        plan = newer
    return plan


def _reduced_or_newer(cell: Cell, batch: int, held: dict[str, int], attempt: int) -> ReducePlan | None:
    """None once the core confirms the reduction of plan `attempt`; else the newer plan."""

    def probe() -> tuple[ReducePlan | None] | None:
        cell.queue(batch).renew(cell.config.cell, held)
        if cell.board.reduced(batch) == attempt:
            return (None,)
        newer = cell.board.plan(batch)
        return (newer,) if newer is not None and newer.attempt > attempt else None

    (result,) = cell.wait_for(f"the reduction of batch {batch}", probe)
    return result


def run_satellite(
    cell: Cell,
    bursts: tuple[BurstPlan, ...],
    *,
    record_roles: bool = True,
    on_join: Callable[[int], None] | None = None,
) -> None:
    """Take part in the batches `bursts` give this cell (`BurstPlan.joins`), as a satellite.

    `record_roles=False` leaves the cell's role changes to whoever decides them (a live run's
    controller); `on_join(batch)` is called once per burst, when the cell has joined a batch
    and holds the core's snapshot."""
    c = cell.config
    have: int | None = None  # the policy version this replica holds
    for burst in bursts:
        join = burst.joins.get(c.cell)
        if join is None:
            continue
        position, claims_before = join
        joined = False
        for batch in burst.batches[position:]:
            version = cell.wait_for(f"opening of batch {batch}", partial(cell.board.opened, batch))
            queue = cell.queue(batch)
            if not joined:

                def join_point(q: MicroStepQueue = queue, n: int = claims_before) -> bool | None:
                    return True if q.claims_made() >= n or q.clip() is not None else None

                cell.wait_for(f"join point of batch {batch}", join_point)
            queue.renew(c.cell, [])  # heartbeat before joining: the core must see this cell alive
            if not cell.board.join(batch, c.cell, version):
                continue  # the window closed first: try the burst's next batch
            first = not joined
            if first and record_roles:
                cell.role(CellRole.TRAINING, CellRole.ROLLOUT, f"joined batch {batch}")
            joined = True
            cell.record(
                CellJoinedBatch(
                    run_id=c.run_id,
                    batch=batch,
                    cell=c.cell,
                    policy_version=version,
                    claims_before=queue.claims_made(),
                    transport=c.transport,
                )
            )
            if have != version:
                cell.replica.pull(version, c.wait_timeout_s)
                have = version
            if first and on_join is not None:
                on_join(batch)
            cell.replica.zero_gradients()
            plan, loss = _satellite_batch(cell, batch)
            if c.cell in plan.cells:
                plan = _reduce_on_satellite(cell, batch, plan, loss)
            if c.cell in plan.cells and not plan.final:
                cell.replica.broadcast(plan)
                have = version + 1
            cell.replica.zero_gradients()
        if joined and record_roles:
            cell.role(CellRole.ROLLOUT, CellRole.TRAINING, "burst end: satellite returns to rollout")
