"""The Redis claim queue and batch board against a real Redis: disjoint claims, takeover of a
silent cell's claims, renewal, first-write-wins pass-1 shares, the join window."""

from __future__ import annotations

import time

import numpy as np
import redis

from gyre_train.cells.board import RedisBatchBoard, SnapshotDescriptor
from gyre_train.cells.claims import Phase, QueueConfig, RedisMicroStepQueue
from gyre_train.cells.session import SyntheticBatchConfig, enqueue_batch, synthetic_batch
from gyre_train.cells.wire import RatioShare
from gyre_train.objective.loss import LossConfig, clip_executions


def _queue(client: redis.Redis, prefix: str, timeout_s: float = 0.3) -> RedisMicroStepQueue:
    return RedisMicroStepQueue(client, QueueConfig(prefix, claim_timeout_s=timeout_s), batch=0)


def test_claims_are_disjoint_one_at_a_time_and_survive_the_round_trip(
    redis_client: redis.Redis, prefix: str
) -> None:
    steps, executions = synthetic_batch(0, 0)
    queue = _queue(redis_client, prefix)
    enqueue_batch(queue, steps, executions)
    seen: dict[int, int] = {}
    cell = 0
    while (task := queue.claim(cell % 2)) is not None:
        assert task.phase is Phase.RATIOS and task.deliveries == 1
        assert task.index not in seen
        seen[task.index] = cell % 2
        cell += 1
    assert sorted(seen) == list(range(len(steps)))
    assert set(seen.values()) == {0, 1}
    assert queue.claims_made() == len(steps)
    manifest = queue.manifest()
    assert manifest is not None and manifest.micro_steps == len(steps)
    assert manifest.summaries() == executions
    for step in steps:
        back = queue.micro_step(step.index)
        assert back.execution_ids == step.execution_ids and back.rows == step.rows
        for name in ("token_ids", "position_ids", "row_starts", "target_mask", "behaviour_logprobs", "slots",
                     "coefficients", "execution_advantages"):  # fmt: skip
            np.testing.assert_array_equal(getattr(back, name), getattr(step, name))
    assert {c.cell for c in queue.pending()} == {0, 1}
    assert queue.ack([c.message_id for c in queue.pending()]) == len(steps)
    assert queue.pending() == []


def test_a_silent_cells_claim_behind_many_live_ones_is_taken_over(
    redis_client: redis.Redis, prefix: str
) -> None:
    # XAUTOCLAIM scans at most 10 x COUNT pending entries per call; the silent claim is the 25th.
    steps, executions = synthetic_batch(0, 0, SyntheticBatchConfig(groups=8, executions=4, token_budget=48))
    assert len(steps) >= 25
    queue = _queue(redis_client, prefix)
    enqueue_batch(queue, steps, executions)
    live = [task.message_id for _ in range(24) if (task := queue.claim(0)) is not None]
    silent = queue.claim(1)
    assert len(live) == 24 and silent is not None
    deadline = time.monotonic() + 2.0
    taken = None
    while taken is None and time.monotonic() < deadline:
        queue.renew(0, live)
        taken = queue.reclaim(2)
        time.sleep(0.05)
    assert taken is not None and taken.message_id == silent.message_id
    assert queue.reclaim(2) is None  # the live ones were renewed, so they are not idle


def test_a_silent_cells_claim_is_taken_over_after_the_timeout_and_a_renewed_one_is_not(
    redis_client: redis.Redis, prefix: str
) -> None:
    steps, executions = synthetic_batch(0, 0, SyntheticBatchConfig(groups=1, executions=2))
    queue = _queue(redis_client, prefix)
    enqueue_batch(queue, steps[:2], executions)
    silent = queue.claim(1)
    renewing = queue.claim(2)
    assert silent is not None and renewing is not None
    assert queue.reclaim(3) is None  # nothing idle yet
    deadline = time.monotonic() + 2.0
    taken = None
    while taken is None and time.monotonic() < deadline:
        assert queue.renew(2, [renewing.message_id]) == {renewing.message_id}
        taken = queue.reclaim(3)
        time.sleep(0.05)
    assert taken is not None
    assert (taken.message_id, taken.index, taken.deliveries) == (silent.message_id, silent.index, 2)
    # The silent cell learns it lost the claim before it would accumulate the gradient.
    assert queue.renew(1, [silent.message_id]) == frozenset()
    assert {(c.message_id, c.cell) for c in queue.pending()} == {
        (silent.message_id, 3),
        (renewing.message_id, 2),
    }
    forced = queue.take_over(0, renewing.message_id)
    assert forced is not None and forced.index == renewing.index
    assert queue.renew(2, [renewing.message_id]) == frozenset()


def test_pass_one_shares_are_first_write_wins_and_gradients_open_once(
    redis_client: redis.Redis, prefix: str
) -> None:
    steps, executions = synthetic_batch(0, 0)
    queue = _queue(redis_client, prefix)
    enqueue_batch(queue, steps, executions)
    first = RatioShare(0, ["a"], [0.5], [3])
    assert queue.put_ratio(first)
    assert not queue.put_ratio(RatioShare(0, ["a"], [9.0], [3]))
    assert queue.ratio_shares() == [first] and queue.ratio_count() == 1
    clip = clip_executions(["a"], [0.5], [3], [1.0], LossConfig())
    while queue.claim(0) is not None:
        pass
    queue.open_gradients(clip)
    queue.open_gradients(clip)
    stored = queue.clip()
    assert stored is not None and stored.execution_ids == ("a",)
    np.testing.assert_array_equal(stored.clip_mask, clip.clip_mask)
    gradient_tasks = []
    while (task := queue.claim(1)) is not None:
        gradient_tasks.append(task)
    assert [t.phase for t in gradient_tasks] == [Phase.GRADIENTS] * len(steps)
    assert sorted(t.index for t in gradient_tasks) == list(range(len(steps)))


def test_the_join_window_closes_atomically(redis_client: redis.Redis, prefix: str) -> None:
    board = RedisBatchBoard(redis_client, QueueConfig(prefix))
    board.open_batch(4, policy_version=2)
    assert board.opened(4) == 2 and board.opened(5) is None
    assert board.join(4, 1, 2)
    assert board.close_window(4) == {1}
    assert not board.join(4, 2, 2)
    assert board.members(4) == {1}
    board.report_drained(4, 1, {"1-0": 3})
    assert board.drained(4) == {1: {"1-0": 3}}
    board.put_snapshot(SnapshotDescriptor(2, 10, "torch"))
    snapshot = board.snapshot()
    assert snapshot is not None and snapshot.policy_version == 2
    board.request_pull(2)
    assert board.next_pull() == 2 and board.next_pull() is None
