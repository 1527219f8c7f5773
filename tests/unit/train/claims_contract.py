"""The claim-queue and batch-board contract: one suite, run against every implementation.

Subclasses provide a ``run`` fixture: a `Claims` whose queues and board belong to one run with a
claim timeout of `TIMEOUT_S`, and a `wait` that lets time pass for them without sleeping (a clock
step in memory; on Redis, every pending claim made that much older and every heartbeat that much
shorter). Only `wait` moves them towards the timeout, so no test races the machine's own clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from gyre_train import ClaimQueueError
from gyre_train.cells import (
    BatchBoard,
    MicroStepQueue,
    Phase,
    RatioShare,
    ReducePlan,
    SnapshotDescriptor,
    SyntheticBatchConfig,
    enqueue_batch,
    synthetic_batch,
)
from gyre_train.objective import LossConfig, clip_executions

# Longer than any test may run (pytest's timeout is 300 s): real time spent between two calls on a
# loaded machine never makes a claim idle or a heartbeat lapse, only `wait` does.
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Claims:
    """The queues and the board of one run, and how to let time pass for them."""

    queue: Callable[[int], MicroStepQueue]
    board: BatchBoard
    wait: Callable[[float], None]


class ClaimsContract:
    """Behaviour every `MicroStepQueue` and `BatchBoard` must have."""

    def test_claims_are_disjoint_one_at_a_time_and_survive_the_round_trip(self, run: Claims) -> None:
        steps, executions = synthetic_batch(0, 0)
        queue = run.queue(0)
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
            for name in ("token_ids", "position_ids", "row_starts", "target_mask", "behaviour_logprobs",
                         "slots", "coefficients", "execution_advantages"):  # fmt: skip
                np.testing.assert_array_equal(getattr(back, name), getattr(step, name))
        assert {c.cell for c in queue.pending()} == {0, 1}
        assert queue.ack([c.message_id for c in queue.pending()]) == len(steps)
        assert queue.pending() == []

    def test_a_silent_cells_claim_behind_many_live_ones_is_taken_over(self, run: Claims) -> None:
        # Redis' XAUTOCLAIM scans at most 10 x COUNT pending entries per call; the silent claim
        # is the 25th.
        config = SyntheticBatchConfig(groups=8, executions=4, token_budget=48)
        steps, executions = synthetic_batch(0, 0, config)
        assert len(steps) >= 25
        queue = run.queue(0)
        enqueue_batch(queue, steps, executions)
        live = [task.message_id for _ in range(24) if (task := queue.claim(0)) is not None]
        silent = queue.claim(1)
        assert len(live) == 24 and silent is not None
        run.wait(TIMEOUT_S * 0.75)
        queue.renew(0, live)
        assert queue.reclaim(2) is None  # the silent claim is not idle long enough yet
        run.wait(TIMEOUT_S * 0.5)
        queue.renew(0, live)
        taken = queue.reclaim(2)
        assert taken is not None and taken.message_id == silent.message_id
        assert queue.reclaim(2) is None  # the live ones were renewed, so they are not idle

    def test_a_silent_cells_claim_is_taken_over_after_the_timeout_and_a_renewed_one_is_not(
        self, run: Claims
    ) -> None:
        steps, executions = synthetic_batch(0, 0, SyntheticBatchConfig(groups=1, executions=2))
        queue = run.queue(0)
        enqueue_batch(queue, steps[:2], executions)
        silent = queue.claim(1)
        renewing = queue.claim(2)
        assert silent is not None and renewing is not None
        assert queue.reclaim(3) is None  # nothing idle yet
        run.wait(TIMEOUT_S * 0.75)
        assert queue.renew(2, [renewing.message_id]) == {renewing.message_id}
        assert queue.reclaim(3) is None  # three quarters of the timeout: still nothing
        run.wait(TIMEOUT_S * 0.5)
        assert queue.renew(2, [renewing.message_id]) == {renewing.message_id}
        taken = queue.reclaim(3)
        assert taken is not None
        assert (taken.message_id, taken.index, taken.deliveries) == (silent.message_id, silent.index, 2)
        assert queue.reclaim(3) is None  # the renewed claim is not idle
        # The silent cell learns it lost the claim before it would accumulate the gradient.
        assert queue.renew(1, [silent.message_id]) == frozenset()
        assert {(c.message_id, c.cell) for c in queue.pending()} == {
            (silent.message_id, 3),
            (renewing.message_id, 2),
        }
        forced = queue.take_over(0, renewing.message_id)
        assert forced is not None and forced.index == renewing.index and forced.deliveries == 2
        assert queue.renew(2, [renewing.message_id]) == frozenset()

    def test_an_acknowledged_claim_cannot_be_taken_over_or_acknowledged_again(self, run: Claims) -> None:
        steps, executions = synthetic_batch(0, 0, SyntheticBatchConfig(groups=1, executions=2))
        queue = run.queue(0)
        enqueue_batch(queue, steps[:2], executions)
        first, second = queue.claim(1), queue.claim(1)
        assert first is not None and second is not None
        assert queue.ack([first.message_id]) == 1
        assert queue.ack([first.message_id, second.message_id]) == 1
        assert queue.take_over(0, first.message_id) is None
        assert queue.renew(1, [first.message_id]) == frozenset()
        assert queue.pending() == [] and queue.claim(0) is None

    def test_pass_one_shares_are_first_write_wins_and_gradients_open_once(self, run: Claims) -> None:
        steps, executions = synthetic_batch(0, 0)
        queue = run.queue(0)
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

    def test_a_batch_refuses_foreign_micro_steps_and_pass_two_before_it_closes(self, run: Claims) -> None:
        steps, _ = synthetic_batch(0, 1)
        queue = run.queue(0)
        assert queue.batch == 0 and queue.manifest() is None and queue.clip() is None
        with pytest.raises(ClaimQueueError, match="batch 1 put into batch 0"):
            queue.put(steps[0])
        with pytest.raises(ClaimQueueError, match="no micro-step 0"):
            queue.micro_step(0)
        with pytest.raises(ClaimQueueError, match="not closed"):
            queue.open_gradients(clip_executions(["a"], [0.5], [3], [1.0], LossConfig()))
        assert queue.claim(0) is None and queue.claims_made() == 0

    def test_the_queues_of_two_batches_are_apart(self, run: Claims) -> None:
        for batch in (0, 1):
            steps, executions = synthetic_batch(0, batch, SyntheticBatchConfig(groups=1, executions=2))
            enqueue_batch(run.queue(batch), steps[:1], executions)
        task = run.queue(0).claim(0)
        assert task is not None and run.queue(0).claim(0) is None
        assert run.queue(1).claims_made() == 0 and run.queue(1).pending() == []
        other = run.queue(1).claim(0)
        assert other is not None and run.queue(1).micro_step(other.index).batch == 1

    def test_the_join_window_closes_atomically(self, run: Claims) -> None:
        board = run.board
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

    def test_a_heartbeat_renewed_on_any_batch_keeps_a_cell_alive_until_the_timeout(self, run: Claims) -> None:
        board = run.board
        assert board.alive([0, 1, 2]) == frozenset() and board.alive([]) == frozenset()
        run.queue(0).renew(1, [])
        run.queue(7).renew(2, [])
        assert board.alive([0, 1, 2]) == {1, 2}
        run.wait(TIMEOUT_S * 0.75)
        run.queue(3).renew(2, [])
        assert board.alive([0, 1, 2]) == {1, 2}  # cell 1's heartbeat is not out yet
        run.wait(TIMEOUT_S * 0.5)
        assert board.alive([0, 1, 2]) == {2}  # 1.25 timeouts for cell 1, a half for cell 2

    def test_plans_reductions_updates_and_pulls_are_per_batch_and_in_order(self, run: Claims) -> None:
        board = run.board
        assert board.plan(3) is None and board.reduced(3) is None and board.updated(3) is None
        first = ReducePlan(3, (0, 1), ((("1-0", 0),), (("2-0", 1),)), (), final=False)
        newer = ReducePlan(3, (0,), ((("1-0", 0), ("2-0", 1)),), (1,), final=False, attempt=1)
        board.put_plan(first)
        assert board.plan(3) == first and board.plan(4) is None
        board.put_plan(newer)
        assert board.plan(3) == newer
        board.put_reduced(3, 1)
        board.put_updated(3, 5)
        assert (board.reduced(3), board.updated(3), board.updated(4)) == (1, 5, None)
        board.report_drained(3, 1, {})
        board.report_drained(3, 2, {"2-0": 1})
        assert board.drained(3) == {1: {}, 2: {"2-0": 1}} and board.drained(4) == {}
        for cell in (2, 1, 2):
            board.request_pull(cell)
        assert [board.next_pull() for _ in range(4)] == [2, 1, 2, None]
        assert board.members(3) == frozenset() and board.close_window(3) == frozenset()
