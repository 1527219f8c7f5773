"""Cells: the core and the satellites training one batch together, with dynamic membership.

Every cell is a process with its own replica; cell 0, the core, holds the authoritative weights and
the only optimizer. The K processes start together and build one communication group per prefix
2..K once (backend processes stay alive across role changes); a satellite takes part in a batch by
joining it in flight: it registers on the board, pulls the core's snapshot and starts claiming.
When the core finds nothing left to claim it closes the join window, plans the reduction
(membership.py), reduces the prefix's gradients onto itself with the prefix's group, makes one
update, then broadcasts to the prefix (non-final update of a burst) or publishes to the engines
(final update). Each batch pays one warm-up (join, pull) and one drain (report, reduce). A cell
may be several processes (Megatron tensor and pipeline parallel): its leader runs everything
below and the replica (replica.py) mirrors each model operation on the other ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import redis
import torch.distributed as dist

from gyre_store import EventLog, NewEvent, PostgresEventLog, StoreConfig
from gyre_store.catalog.run import CellRole, CellRoleChanged, WeightsPublished
from gyre_store.catalog.training import (
    CellJoinedBatch,
    ContributionAccepted,
    MicroStepClaimed,
    TrainingUpdate,
    contribution_key,
)
from gyre_store.log.events import Event, EventMetadata
from gyre_train.backends.pytorch import OptimizerConfig, TrainingBackend
from gyre_train.cells.board import RedisBatchBoard
from gyre_train.cells.claims import Phase, QueueConfig, RedisMicroStepQueue, Task
from gyre_train.cells.local import merge_shares
from gyre_train.cells.membership import CORE, ReducePlan, TakeOver, Wait, plan_reduction
from gyre_train.cells.publish import EnginePublisher, EnginePublisherConfig, WeightPublisher
from gyre_train.cells.replica import CellModel, RankLayout, Replica, layout_of, open_backend
from gyre_train.cells.transport import WeightTransport, make_transport
from gyre_train.exceptions import CellFailedError, InvalidConfigError
from gyre_train.objective.loss import ExecutionClip, LossConfig
from gyre_train.trajectories.packing import MicroStep

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BurstPlan:
    """Consecutive batches trained before one publication, and when satellites join.

    `joins[s] = (p, n)`: satellite s joins the burst's p-th batch once n micro-step claims of it
    were handed out, and stays until the burst ends (then returns to rollout).
    """

    batches: tuple[int, ...]
    joins: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    core_stays: bool = True  # at the burst end: stay in training, or return to rollout


@dataclass(frozen=True, slots=True)
class CellConfig:
    """Everything one cell process is built from (picklable: it crosses a process start)."""

    run_id: str
    cell: int
    cells: int  # K
    redis_url: str
    dist_init: str  # e.g. tcp://127.0.0.1:29500, shared by every process of the K cells
    queue: QueueConfig
    model: CellModel
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    transport: str = "torch"
    dist_backend: str = "gloo"
    database_url: str | None = None
    engines: EnginePublisherConfig | None = None
    output_dir: Path | None = None  # the core writes its flat parameters after each update here
    step_delay_s: float = 0.0  # slows each gradient micro-step (tests of slow and dying cells)
    wait_timeout_s: float = 120.0
    position: int = 0  # this process's place inside its cell (0: the leader)

    def __post_init__(self) -> None:
        layout_of(self.model, self.cells, self.cell, self.position)  # raises on a bad place
        if self.dist_backend != "gloo":
            # NCCL collectives need CUDA tensors; the backends and the replica keep theirs on the CPU.
            raise InvalidConfigError(
                f"cells run over gloo only (got {self.dist_backend!r}): GPU cells over NCCL are not built"
            )

    @property
    def layout(self) -> RankLayout:
        return layout_of(self.model, self.cells, self.cell, self.position)


class _Recorder:
    """Appends this cell's events when a database is configured; a no-op otherwise."""

    def __init__(self, log: EventLog | None, run_id: str) -> None:
        self._log = log
        self._meta = EventMetadata(run_id=run_id)

    def __call__(self, *events: Event, keys: tuple[str | None, ...] = ()) -> None:
        if self._log is None or not events:
            return
        keyed = keys or (None,) * len(events)
        self._log.append(
            [NewEvent(e, idempotency_key=k, metadata=self._meta) for e, k in zip(events, keyed, strict=True)]
        )


class Cell:
    """One cell leader's state: replica, queue access, transport, event recorder."""

    def __init__(
        self, config: CellConfig, log: EventLog | None, client: redis.Redis, backend: TrainingBackend
    ) -> None:
        self.config = config
        self.redis = client
        self.board = RedisBatchBoard(client, config.queue)
        self.record = _Recorder(log, config.run_id)
        self.transport: WeightTransport = make_transport(config.transport, self.board, config.cell)
        # The replica builds one group per participating prefix 2..K, once, on every process.
        self.replica = Replica(backend, config.layout, config.loss, self.transport, self.board)
        self.version = 0
        self._steps: dict[tuple[int, int], MicroStep] = {}

    # -- shared by core and satellites ---------------------------------------------------------

    def _step(self, queue: RedisMicroStepQueue, index: int) -> MicroStep:
        key = (queue.batch, index)
        if key not in self._steps:
            self._steps = {k: v for k, v in self._steps.items() if k[0] == queue.batch}
            self._steps[key] = queue.micro_step(index)
        return self._steps[key]

    def process(
        self, queue: RedisMicroStepQueue, task: Task, held: dict[str, int], clip: ExecutionClip | None
    ) -> float:
        """Compute one claimed task; returns the loss share (0 for pass 1)."""
        c = self.config
        step = self._step(queue, task.index)
        self.record(
            MicroStepClaimed(
                run_id=c.run_id,
                batch=queue.batch,
                micro_step=task.index,
                phase=int(task.phase),
                cell=c.cell,
                deliveries=task.deliveries,
            )
        )
        if task.phase is Phase.RATIOS:
            # Pass-1 shares are keyed by micro-step, first write wins: a redelivered task that
            # computes it again changes nothing, so the claim is acknowledged at once.
            queue.put_ratio(self.replica.ratio(step))
            queue.ack([task.message_id])
            return 0.0
        if c.step_delay_s:
            time.sleep(c.step_delay_s)
        # Renewing proves the claim is still ours right before the gradient enters the replica;
        # a claim taken over meanwhile is dropped here, never accumulated twice.
        if task.message_id not in queue.renew(c.cell, [task.message_id]):
            return 0.0
        assert clip is not None  # gradient tasks exist only after the clip was stored
        loss = self.replica.gradient(step, clip)
        held[task.message_id] = task.index
        return loss

    def wait_for(self, what: str, probe: Callable[[], T | None]) -> T:
        deadline = time.monotonic() + self.config.wait_timeout_s
        while (value := probe()) is None:
            if time.monotonic() > deadline:
                raise CellFailedError(
                    f"cell {self.config.cell}: no {what} within {self.config.wait_timeout_s} s"
                )
            time.sleep(self.config.queue.poll_s)
        return value

    def role(self, role: CellRole, previous: CellRole, reason: str) -> None:
        c = self.config
        self.record(
            CellRoleChanged(run_id=c.run_id, cell_index=c.cell, role=role, previous=previous, reason=reason)
        )

    def queue(self, batch: int) -> RedisMicroStepQueue:
        return RedisMicroStepQueue(self.redis, self.config.queue, batch)


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
        deadline = time.monotonic() + cell.config.queue.claim_timeout_s
        while time.monotonic() < deadline:  # keep the core's own claims and heartbeat alive
            cell.queue(batch).renew(CORE, progress.held)
            time.sleep(cell.config.queue.poll_s)


def _run_core(cell: Cell, bursts: tuple[BurstPlan, ...], publisher: WeightPublisher | None) -> None:
    c = cell.config
    cell.replica.expose(cell.version)
    in_training = False
    for burst in bursts:
        if not in_training:
            cell.role(CellRole.TRAINING, CellRole.ROLLOUT, "burst start")
            in_training = True
        for position, batch in enumerate(burst.batches):
            final = position == len(burst.batches) - 1
            cell.replica.zero_gradients()
            cell.board.open_batch(batch, cell.version)
            plan, loss = _reduce_on_core(cell, batch, final)
            queue = cell.queue(batch)
            queue.ack(plan.message_ids())
            contributions: list[Event] = []
            keys: list[str | None] = []
            for member, held in zip(plan.cells, plan.held, strict=True):
                for _, index in held:
                    contributions.append(
                        ContributionAccepted(
                            run_id=c.run_id,
                            batch=batch,
                            micro_step=index,
                            cell=member,
                            policy_version=cell.version,
                        )
                    )
                    keys.append(contribution_key(c.run_id, batch, index))
            cell.record(*contributions, keys=tuple(keys))
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
            if final and publisher is not None:
                events.append(WeightsPublished(run_id=c.run_id, policy_version=cell.version, step=batch))
            cell.record(*events)
            if c.output_dir is not None:
                cell.replica.save(c.output_dir, cell.version)
            cell.board.put_updated(batch, cell.version)
        if not burst.core_stays:
            cell.role(CellRole.ROLLOUT, CellRole.TRAINING, "burst end: core returns to rollout")
            in_training = False


def _satellite_batch(cell: Cell, batch: int) -> tuple[ReducePlan, float]:
    queue, c = cell.queue(batch), cell.config
    held: dict[str, int] = {}
    loss = 0.0
    while cell.board.plan(batch) is None:
        queue.renew(c.cell, held)
        task = queue.claim(c.cell) or queue.reclaim(c.cell)
        if task is not None:
            loss += cell.process(queue, task, held, queue.clip() if task.phase is Phase.GRADIENTS else None)
            continue
        if queue.clip() is not None:
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


def _run_satellite(cell: Cell, bursts: tuple[BurstPlan, ...]) -> None:
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

                def join_point(q: RedisMicroStepQueue = queue, n: int = claims_before) -> bool | None:
                    return True if q.claims_made() >= n or q.clip() is not None else None

                cell.wait_for(f"join point of batch {batch}", join_point)
            queue.renew(c.cell, [])  # heartbeat before joining: the core must see this cell alive
            if not cell.board.join(batch, c.cell, version):
                continue  # the window closed first: try the burst's next batch
            if not joined:
                cell.role(CellRole.TRAINING, CellRole.ROLLOUT, f"joined batch {batch}")
                joined = True
            cell.record(
                CellJoinedBatch(
                    run_id=c.run_id,
                    batch=batch,
                    cell=c.cell,
                    policy_version=version,
                    claims_before=queue.claims_made(),
                    transport=cell.transport.name,
                )
            )
            if have != version:
                cell.replica.pull(version, c.wait_timeout_s)
                have = version
            cell.replica.zero_gradients()
            plan, loss = _satellite_batch(cell, batch)
            if c.cell in plan.cells:
                plan = _reduce_on_satellite(cell, batch, plan, loss)
            if c.cell in plan.cells and not plan.final:
                cell.replica.broadcast(plan)
                have = version + 1
            cell.replica.zero_gradients()
        if joined:
            cell.role(CellRole.ROLLOUT, CellRole.TRAINING, "burst end: satellite returns to rollout")


def run_cell(config: CellConfig, bursts: tuple[BurstPlan, ...]) -> None:
    """Entry point of one process: join the world of the K cells, then train as core or satellite
    (the cell's leader) or mirror the leader's model operations (any other rank of the cell)."""
    layout = config.layout
    dist.init_process_group(
        config.dist_backend,
        init_method=config.dist_init,
        rank=layout.rank,
        world_size=layout.world,
        timeout=datetime.timedelta(seconds=config.wait_timeout_s),
    )
    with contextlib.ExitStack() as stack:
        stack.callback(dist.destroy_process_group)
        backend = stack.enter_context(open_backend(config.model, layout, config.optimizer))
        if not layout.leads:
            Replica(backend, layout, config.loss, None, None).follow()
            return
        client = redis.Redis.from_url(config.redis_url)
        stack.callback(client.close)
        log = (
            stack.enter_context(PostgresEventLog(StoreConfig(config.database_url)))
            if config.database_url
            else None
        )
        cell = Cell(config, log, client, backend)
        stack.callback(cell.transport.close)
        stack.callback(cell.replica.stop)  # followers leave `follow()` however the leader ends
        if config.cell == CORE:
            publisher = stack.enter_context(EnginePublisher(config.engines)) if config.engines else None
            _run_core(cell, bursts, publisher)
        else:
            _run_satellite(cell, bursts)
