"""Streaming training with real processes, real Redis and real PostgreSQL: the update equals one
process training on the whole batch, with satellites joining at random micro-steps, membership
changing across bursts, and a satellite killed with SIGKILL mid-batch."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import redis

from gyre_proxy.engines.refengine import free_port
from gyre_store import PostgresEventLog, iterate
from gyre_store.catalog import (
    CellRole,
    CellRoleChanged,
    ContributionAccepted,
    MicroStepClaimed,
    TrainingUpdate,
)
from gyre_train.backends import ModelSpec, OptimizerConfig
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    CellCluster,
    Phase,
    QueueConfig,
    RedisBatchBoard,
    RedisMicroStepQueue,
    SyntheticBatchConfig,
    cell_configs,
    enqueue_batch,
    synthetic_batch,
)
from tests.integration.train_stream.conftest import elapse, wait_for_members
from tests.integration.train_stream.magnitudes import check_updates
from tests.real_servers import mooncake_missing, unavailable

SPEC = ModelSpec(TINY_QWEN3, seed=3)
# Plain SGD moves every weight by lr * g, so the parameters after several updates see each
# gradient's magnitude; AdamW (what runs in production) keeps its state across bursts on the core.
SGD = OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.0)
ADAMW = OptimizerConfig(lr=1e-2)
OPTIMIZERS = {"sgd": SGD, "adamw": ADAMW}
DATA = SyntheticBatchConfig(groups=2, executions=4, max_rows=2)
# Longer than a test runs: a live cell slowed down by a loaded machine never looks dead. A killed
# one is made to look as it would a claim timeout later (`elapse`) when the test decides.
CLAIM_TIMEOUT_S = 600.0
# A cell index no process has: a board member the test keeps alive (one renewal lasts the whole
# claim timeout) and undrained, so the core cannot plan the reduction until it lets it lapse.
HOLD = 99


def _updates(events: list[object]) -> list[TrainingUpdate]:
    updates = [e for e in events if isinstance(e, TrainingUpdate)]
    assert [u.policy_version for u in updates] == list(range(1, len(updates) + 1))
    return updates


def _events(log: PostgresEventLog) -> list[object]:
    return [e.event for e in iterate(log)]


def _contributions_exactly_once(events: list[object], batches: dict[int, int]) -> Counter[int]:
    by_cell: Counter[int] = Counter()
    seen: Counter[tuple[int, int]] = Counter()
    for event in events:
        if isinstance(event, ContributionAccepted):
            seen[(event.batch, event.micro_step)] += 1
            by_cell[event.cell] += 1
    assert seen == Counter({(b, m): 1 for b, count in batches.items() for m in range(count)})
    return by_cell


@pytest.mark.parametrize(
    ("transport", "optimizer"), [("torch", "sgd"), ("torch", "adamw"), ("mooncake", "sgd")]
)
def test_streaming_with_joining_satellites_equals_one_process(
    transport: str, optimizer: str, redis_client: redis.Redis, prefix: str, redis_url: str, pg_log: PostgresEventLog,
    database_url: str,
) -> None:  # fmt: skip
    if transport == "mooncake" and (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    rng = np.random.default_rng(7)
    batches = [synthetic_batch(11, b, DATA) for b in range(3)]
    sizes = {b: len(steps) for b, (steps, _) in enumerate(batches)}
    # Burst 1: satellites 1 and 2 join batch 0 at random claims (in index order) and stay for
    # batch 1; the core returns to rollout at its end. Burst 2: satellite 2 alone rejoins and
    # must pull the published weights.
    first = int(rng.integers(0, sizes[0]))
    second = int(rng.integers(first, 2 * sizes[0]))
    bursts = [
        BurstPlan(batches=(0, 1), joins={1: (0, first), 2: (0, second)}, core_stays=False),
        BurstPlan(batches=(2,), joins={2: (0, int(rng.integers(0, sizes[2])))}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        configs = cell_configs(
            cells=3, redis_url=redis_url, port=free_port(), model=SPEC,
            queue=QueueConfig(prefix, claim_timeout_s=CLAIM_TIMEOUT_S), optimizer=OPTIMIZERS[optimizer],
            transport=transport, output_dir=output, database_url=database_url,
        )  # fmt: skip
        with CellCluster(configs, bursts) as cluster:
            for b, (steps, executions) in enumerate(batches):
                enqueue_batch(RedisMicroStepQueue(redis_client, configs[0].queue, b), steps, executions, 0.02)
            cluster.wait(timeout_s=120)
        events = _events(pg_log)
        check_updates(output, SPEC, OPTIMIZERS[optimizer], batches, _updates(events))
    by_cell = _contributions_exactly_once(events, sizes)
    assert by_cell[0] > 0 and by_cell[1] + by_cell[2] > 0
    updates = [e for e in events if isinstance(e, TrainingUpdate)]
    assert [(u.policy_version, u.final) for u in updates] == [(1, False), (2, True), (3, True)]
    roles = [(e.cell_index, e.role) for e in events if isinstance(e, CellRoleChanged)]
    assert roles.count((0, CellRole.ROLLOUT)) == 1  # the core returned once, after burst 1
    assert roles.count((1, CellRole.ROLLOUT)) == 1  # satellite 1 left at the end of burst 1
    assert roles.count((2, CellRole.TRAINING)) == 2  # satellite 2 joined both bursts


def test_a_satellite_killed_mid_batch_leaves_the_update_equal(
    redis_client: redis.Redis, prefix: str, redis_url: str, pg_log: PostgresEventLog, database_url: str
) -> None:
    data = dataclasses.replace(DATA, groups=4)
    batch = synthetic_batch(5, 0, data)
    steps, executions = batch
    queue_config = QueueConfig(prefix, claim_timeout_s=CLAIM_TIMEOUT_S)
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        configs = cell_configs(
            cells=3, redis_url=redis_url, port=free_port(), model=SPEC, queue=queue_config,
            optimizer=ADAMW, output_dir=output, database_url=database_url,
        )  # fmt: skip
        # Gradients are slowed down, satellite 2's least: it takes most of the gradient tasks, so
        # it is caught holding claims it has accumulated and one it is computing (it would have to
        # stand still for seconds while the others take 0.3 s a task to get fewer than two).
        configs = [dataclasses.replace(c, step_delay_s=0.1 if c.cell == 2 else 0.3) for c in configs]
        bursts = [BurstPlan(batches=(0,), joins={1: (0, 0), 2: (0, 0)})]
        queue = RedisMicroStepQueue(redis_client, queue_config, 0)
        board = RedisBatchBoard(redis_client, queue_config)
        with CellCluster(configs, bursts) as cluster:
            wait_for_members(board, 0, {1, 2})  # every satellite is in before the first claim
            enqueue_batch(queue, steps, executions)
            deadline = time.monotonic() + 60
            while sum(c.cell == 2 for c in queue.pending() if queue.clip() is not None) < 2:
                assert time.monotonic() < deadline, "satellite 2 never held two gradient claims"
                time.sleep(0.005)
            cluster.kill(2)
            # What the others see a claim timeout after the kill: its heartbeat out, its claims idle.
            elapse(redis_client, prefix, CLAIM_TIMEOUT_S, cells={2})
            cluster.wait(timeout_s=120)
        events = _events(pg_log)
        check_updates(output, SPEC, ADAMW, [batch], _updates(events))
    by_cell = _contributions_exactly_once(events, {0: len(steps)})
    assert by_cell[2] == 0
    gradient_claims = [e for e in events if isinstance(e, MicroStepClaimed) and e.phase == Phase.GRADIENTS]
    lost = {e.micro_step for e in gradient_claims if e.cell == 2}
    assert lost
    taken_over = {e.micro_step for e in gradient_claims if e.cell != 2 and e.deliveries > 1}
    assert lost <= taken_over
    update = next(e for e in events if isinstance(e, TrainingUpdate))
    assert update.cells == [0, 1] and update.micro_steps == len(steps)


@pytest.mark.parametrize("cells", [2, 3])
def test_a_satellite_killed_after_draining_leaves_the_update_equal(
    cells: int, redis_client: redis.Redis, prefix: str, redis_url: str, pg_log: PostgresEventLog,
    database_url: str,
) -> None:  # fmt: skip
    victim = cells - 1
    batch = synthetic_batch(6, 0, dataclasses.replace(DATA, groups=4))
    steps, executions = batch
    # Its heartbeat outlives it: the core plans with it and the reduction fails; with three
    # cells the live satellite 1 must then reduce again under the newer plan.
    queue_config = QueueConfig(prefix, claim_timeout_s=CLAIM_TIMEOUT_S)
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        configs = cell_configs(
            cells=cells, redis_url=redis_url, port=free_port(), model=SPEC, queue=queue_config,
            optimizer=ADAMW, output_dir=output, database_url=database_url,
        )  # fmt: skip
        # The victim is the one fast cell, so it drains holding gradients (it would have to stand
        # still for seconds while the others take 0.2 s a task to hold none).
        configs = [dataclasses.replace(c, step_delay_s=0.0 if c.cell == victim else 0.2) for c in configs]
        queue = RedisMicroStepQueue(redis_client, queue_config, 0)
        board = RedisBatchBoard(redis_client, queue_config)
        joins = {s: (0, 0) for s in range(1, cells)}
        with CellCluster(configs, [BurstPlan(batches=(0,), joins=joins)]) as cluster:
            wait_for_members(board, 0, set(joins))  # every satellite is in before the first claim
            version = board.opened(0)
            assert version is not None and board.join(0, HOLD, version)
            queue.renew(HOLD, [])  # the core cannot plan until HOLD lapses
            enqueue_batch(queue, steps, executions)
            deadline = time.monotonic() + 60
            while victim not in board.drained(0):
                assert time.monotonic() < deadline, "the satellite never drained"
                time.sleep(0.005)
            assert board.plan(0) is None and board.drained(0)[victim]  # it holds gradients, no plan yet
            cluster.kill(victim)
            elapse(redis_client, prefix, CLAIM_TIMEOUT_S, cells={HOLD})  # the core may plan now
            while (plan := board.plan(0)) is None:
                assert time.monotonic() < deadline, "the core never planned"
                time.sleep(0.005)
            assert victim in plan.cells  # planned while the dead victim's heartbeat still counted
            # Now the victim lapses, as a claim timeout after its death: the core, whose reduction
            # failed, takes its claims over and plans again.
            elapse(redis_client, prefix, CLAIM_TIMEOUT_S, cells={victim})
            cluster.wait(timeout_s=120)
        events = _events(pg_log)
        check_updates(output, SPEC, ADAMW, [batch], _updates(events))
    by_cell = _contributions_exactly_once(events, {0: len(steps)})
    assert by_cell[victim] == 0
    update = next(e for e in events if isinstance(e, TrainingUpdate))
    assert update.cells == list(range(cells - 1)) and update.micro_steps == len(steps)
    assert update.failed_reductions == 1
