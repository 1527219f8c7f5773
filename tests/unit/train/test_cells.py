"""The core/satellite protocol on the in-memory queue and board, cells as threads with fake
replicas: joins in flight, a satellite dying while it holds gradients or inside the reduction,
claims behind a dead cell taken over by the core. Each micro-step must count exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import cast

import pytest

from gyre_store.catalog import (
    CellJoinedBatch,
    CellRole,
    CellRoleChanged,
    ContributionAccepted,
    MicroStepClaimed,
    MicroStepComputed,
    TrainingUpdate,
    WeightsPublished,
)
from gyre_train.backends import ModelSpec
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    Cell,
    InMemoryClaims,
    InMemoryMicroStepQueue,
    MicroStepQueue,
    Phase,
    QueueConfig,
    ReducePlan,
    SyntheticBatchConfig,
    Task,
    cell_configs,
    enqueue_batch,
    merge_shares,
    synthetic_batch,
)
from gyre_train.cells.satellite import _satellite_batch
from gyre_train.objective import ExecutionClip, LossConfig
from tests.unit.train.cell_fakes import WAIT_S, Batch, CellRun, FakeCollective, FakeReplica, train_in_threads

DATA = SyntheticBatchConfig(groups=4, executions=4, max_rows=2)


def _batches(seed: int, count: int) -> list[Batch]:
    return [synthetic_batch(seed, b, DATA) for b in range(count)]


def _each_once(run: CellRun, batches: list[Batch]) -> Counter[int]:
    """Every update reduced each micro-step of its batch exactly once, and recorded it so; returns
    the contributions by cell."""
    assert run.collective.updates == [Counter(range(len(steps))) for steps, _ in batches]
    seen = Counter((e.batch, e.micro_step) for e in run.events(ContributionAccepted))
    assert seen == Counter({(b, m): 1 for b, (steps, _) in enumerate(batches) for m in range(len(steps))})
    for batch in range(len(batches)):
        assert run.claims.queue(batch).pending() == []  # every claim acknowledged after the update
    return Counter(e.cell for e in run.events(ContributionAccepted))


def _updates(run: CellRun) -> list[TrainingUpdate]:
    return run.events(TrainingUpdate)


def test_a_core_alone_trains_every_micro_step_once() -> None:
    batches = _batches(1, 1)
    run = train_in_threads(batches, [BurstPlan(batches=(0,))], cells=1)
    assert _each_once(run, batches) == Counter({0: len(batches[0][0])})
    [update] = _updates(run)
    assert (update.cells, update.dropped, update.failed_reductions, update.final) == ([0], [], 0, True)
    assert run.claims.board.updated(0) == 1 and run.replicas[0].published == [1]
    # Each pass of each micro-step is timed once, by the cell that computed it.
    computed = Counter((e.micro_step, e.phase) for e in run.events(MicroStepComputed))
    steps = len(batches[0][0])
    assert computed == Counter({(m, p): 1 for m in range(steps) for p in (1, 2)})
    assert all(e.seconds >= 0 and e.tokens > 0 and e.cell == 0 for e in run.events(MicroStepComputed))


def test_satellites_join_in_flight_read_the_batchs_weights_and_share_it_exactly_once() -> None:
    batches = _batches(2, 3)
    bursts = [
        BurstPlan(batches=(0, 1), joins={1: (0, 1), 2: (0, 3)}, core_stays=False),
        BurstPlan(batches=(2,), joins={2: (0, 1)}),
    ]
    run = train_in_threads(batches, bursts, cells=3, step_delays={0: 0.02})
    by_cell = _each_once(run, batches)
    assert by_cell[0] > 0 and by_cell[1] + by_cell[2] > 0
    # Weights are frozen during a batch: every gradient of batch b, on any cell, saw version b.
    for replica in run.replicas.values():
        assert all(batch == version for batch, version in replica.computed)
    assert [(u.policy_version, u.final) for u in _updates(run)] == [(1, False), (2, True), (3, True)]
    assert run.replicas[0].published == [2, 3]
    assert [e.policy_version for e in run.events(WeightsPublished)] == [2, 3]
    assert run.replicas[2].pulls[-1] == 2  # rejoining after the burst: pulls the published weights
    joined = run.events(CellJoinedBatch)
    assert {e.cell for e in joined} == {1, 2}
    roles = [(e.cell_index, e.role) for e in run.events(CellRoleChanged)]
    assert roles.count((0, CellRole.ROLLOUT)) == 1  # the core returned once, after burst 1
    assert roles.count((1, CellRole.ROLLOUT)) == 1  # satellite 1 left at the end of burst 1
    assert roles.count((2, CellRole.TRAINING)) == 2  # satellite 2 joined both bursts


def test_a_satellite_dying_while_it_holds_gradients_is_left_out_and_its_claims_taken_over() -> None:
    batches = _batches(3, 1)
    bursts = [BurstPlan(batches=(0,), joins={1: (0, 0), 2: (0, 0)})]
    # Satellite 2 dies computing its third gradient: it holds two and has a third claimed.
    run = train_in_threads(batches, bursts, cells=3, dies_at_gradient={2: 3}, step_delays={0: 0.05, 1: 0.05})
    assert run.killed == {2}
    by_cell = _each_once(run, batches)
    assert by_cell[2] == 0
    claimed = [e for e in run.events(MicroStepClaimed) if e.phase == Phase.GRADIENTS]
    lost = {e.micro_step for e in claimed if e.cell == 2}
    assert len(lost) == 3
    taken_over = {e.micro_step for e in claimed if e.cell != 2 and e.deliveries > 1}
    assert lost <= taken_over
    [update] = _updates(run)
    assert (update.cells, update.failed_reductions) == ([0, 1], 0)


@pytest.mark.parametrize("cells", [2, 3])
def test_a_satellite_dying_inside_the_reduction_fails_it_once_and_the_core_plans_again(cells: int) -> None:
    victim = cells - 1
    batches = _batches(4, 1)
    joins = {s: (0, 0) for s in range(1, cells)}
    # The others are slow, so the victim drains holding gradients long before the core plans;
    # its heartbeat still counts it alive then, so the first plan includes it.
    run = train_in_threads(
        batches, [BurstPlan(batches=(0,), joins=joins)], cells=cells, dies_in_reduce={victim},
        step_delays={c: 0.05 for c in range(cells - 1)},
    )  # fmt: skip
    assert run.killed == {victim}
    assert run.replicas[victim].gradients  # it died holding gradients, which were recomputed
    by_cell = _each_once(run, batches)
    assert by_cell[victim] == 0
    [update] = _updates(run)
    assert update.cells == list(range(cells - 1)) and update.failed_reductions == 1
    assert run.replicas[0].reductions == [0, 1]
    if cells == 3:
        assert run.replicas[1].reductions == [0, 1]  # the live satellite reduced again, under plan 1


def test_claims_of_a_live_satellite_behind_a_dead_one_are_taken_over_by_the_core() -> None:
    batches = _batches(5, 1)
    bursts = [BurstPlan(batches=(0,), joins={1: (0, 0), 2: (0, 0)})]
    # Satellite 1 dies at its first gradient: cell 2 is alive but outside the live prefix 0..0.
    run = train_in_threads(batches, bursts, cells=3, dies_at_gradient={1: 1}, step_delays={0: 0.05, 2: 0.05})
    assert run.killed == {1}
    assert _each_once(run, batches) == Counter({0: len(batches[0][0])})
    [update] = _updates(run)
    assert (update.cells, update.dropped, update.failed_reductions) == ([0], [2], 0)
    assert run.replicas[2].reductions == []  # dropped: its gradients were discarded, not reduced


class _OpensPassTwoAfterAnEmptyClaim:
    """The batch's queue, with the core opening pass 2 right after the satellite found nothing."""

    def __init__(self, queue: InMemoryMicroStepQueue, clip: ExecutionClip) -> None:
        self._queue = queue
        self._clip = clip

    def claim(self, cell: int) -> Task | None:
        task = self._queue.claim(cell)
        if task is None and self._queue.clip() is None:
            self._queue.open_gradients(self._clip)
        return task

    def __getattr__(self, name: str) -> object:
        return getattr(self._queue, name)


def test_a_satellite_finding_nothing_just_before_pass_two_opens_does_not_drain_empty() -> None:
    claims = InMemoryClaims(QueueConfig("fake", claim_timeout_s=5.0, poll_s=0.001))
    steps, executions = synthetic_batch(7, 0, DATA)
    queue = claims.queue(0)
    enqueue_batch(queue, steps, executions)
    replica = FakeReplica(1, FakeCollective())
    while (task := queue.claim(0)) is not None:  # pass 1, done by the core
        queue.put_ratio(replica.ratio(queue.micro_step(task.index)))
        queue.ack([task.message_id])
    manifest = queue.manifest()
    assert manifest is not None
    clip = merge_shares(queue.ratio_shares(), manifest.summaries(), LossConfig())
    wrapped = cast(MicroStepQueue, _OpensPassTwoAfterAnEmptyClaim(queue, clip))
    [config] = [c for c in cell_configs(cells=2, redis_url="", port=0, model=ModelSpec(TINY_QWEN3),
                                        queue=claims.config, wait_timeout_s=WAIT_S) if c.cell == 1]  # fmt: skip
    cell = Cell(config, None, lambda _: wrapped, claims.board, replica)

    def plan_once_drained() -> None:
        while 1 not in claims.board.drained(0):
            time.sleep(0.001)
        claims.board.put_plan(ReducePlan(0, (0, 1), ((), ()), (), final=True))

    planner = threading.Thread(target=plan_once_drained)
    planner.start()
    _satellite_batch(cell, 0)
    planner.join()
    # The clip is stored with every gradient task: this cell must claim them, not report drained.
    assert sorted(claims.board.drained(0)[1].values()) == list(range(len(steps)))
    assert sorted(replica.gradients) == list(range(len(steps)))
