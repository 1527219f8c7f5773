"""Rollout groups from the store: readiness, advantages, admission into rows, consumption, packing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gyre_store import (
    FinishReason,
    GroupConsumed,
    InMemoryEventLog,
    InMemoryProjectionStore,
    NewEvent,
    NoTrajectoryTree,
    RewardAssigned,
    StoreUnavailable,
    catch_up,
    new_outcome,
    rebuild,
)
from gyre_store.trees import TreeView
from gyre_train import (
    AdmissionConfig,
    AdvantageConfig,
    BatchPacker,
    CallableEvaluator,
    EvaluationConfig,
    EvaluationRunner,
    GroupNotTrainableError,
    GroupSourceConfig,
    PackingConfig,
    PreservedState,
    StoreGroupSource,
    UnknownGroupError,
    admission_rng,
    admit,
    execution_rows,
    stored_execution,
)
from tests.unit.train.runs import (
    catch_all,
    dispatch_group,
    finish,
    memory_store,
    projections,
    record_trace,
    start,
)

RUN = "run-groups"
INF = float("inf")
SCORES = {"a": 1.0, "b": 0.5, "d": 0.0, "e": 1.0}


def _judge(state: PreservedState) -> float:
    if state.execution_id == "f":
        raise RuntimeError("grader crashed")
    return SCORES[state.execution_id]


def _run(log: InMemoryEventLog) -> EvaluationRunner:
    dispatch_group(log, RUN, "g-old", ["a", "b", "c"], policy_version=0)
    dispatch_group(log, RUN, "g-new", ["d", "e", "f"], policy_version=1)
    for seed, e in enumerate(("a", "b", "d", "e")):
        start(log, e, RUN)
        record_trace(log, e, RUN, seed=5 + seed)
    start(log, "f", RUN)
    record_trace(log, "f", RUN, seed=9)  # excluded later: its trajectories must not be trained
    runner = EvaluationRunner(
        log, CallableEvaluator(_judge), EvaluationConfig(max_attempts=2, retry_delay_s=0)
    )
    for e in ("a", "b", "d", "e", "f"):
        runner.preserve(e, "v1", location=f"/ws/{e}")
    return runner


def _finish_new_group(log: InMemoryEventLog, runner: EvaluationRunner, e_finish: FinishReason) -> None:
    """End and evaluate g-new's executions: d completed, e with ``e_finish``, f failed (excluded)."""
    for e, reason in (("d", FinishReason.COMPLETED), ("e", e_finish), ("f", FinishReason.FAILED)):
        finish(log, e, RUN, reason)
        runner.settle(e, deadline=INF)


def test_groups_become_ready_oldest_policy_first_and_turn_into_rows() -> None:
    log = InMemoryEventLog()
    runner = _run(log)
    store = memory_store(log)
    config = GroupSourceConfig(
        AdmissionConfig(max_trajectories=2), AdvantageConfig(scale_by_std=False), seed=3
    )
    source = StoreGroupSource(log, store, config, step=7)
    assert source.ready_groups() == ()
    _finish_new_group(log, runner, FinishReason.HARNESS_TIMEOUT)
    [ticket] = source.ready_groups()
    assert (ticket.group_id, ticket.policy_version) == ("g-new", 1)
    finish(log, "a", RUN)
    finish(log, "b", RUN, FinishReason.OVERALL_TIMEOUT)
    finish(log, "c", RUN, FinishReason.FAILED)  # never started: a placeholder
    assert len(source.ready_groups()) == 1  # c has no outcome yet: the group is not ready
    for e in ("a", "b", "c"):
        runner.settle(e, deadline=INF)

    packer = BatchPacker(PackingConfig(token_budget=400_000, groups_per_batch=2, executions_per_group=3), 0)
    steps = packer.pull(source)
    assert [g.group_id for g in packer.groups] == ["g-old", "g-new"]  # oldest policy version first
    assert steps and steps[-1].closes_stream

    old, new = packer.groups
    assert [(e.execution_id, e.advantage) for e in old.executions] == [("a", 0.5), ("b", 0.0), ("c", -0.5)]
    assert old.executions[2].rows == ()  # the placeholder counts in the group but has no trajectory
    # f was excluded (no valid reward): out of the statistics, advantage 0, no rows.
    assert [(e.execution_id, e.advantage) for e in new.executions] == [("d", -0.5), ("e", 0.5), ("f", 0.0)]
    assert new.executions[2].rows == () and new.executions[0].rows  # a valid zero is trainable

    stored = stored_execution(TreeView.load(store, "a"))
    admission = admit(stored.tree, config.admission, admission_rng(3, "a"))
    rows = old.executions[0].rows
    assert len(rows) == len(admission.trajectories) == 2
    assert sum(r.target_count for r in rows) == admission.target_count
    trainable = {int(t) for n in stored.tokens.nodes for t in n.token_ids[n.trainable]}
    assert all(set(r.token_ids[r.target_mask].tolist()) <= trainable for r in rows)

    assert source.ready_groups() == ()  # both consumed
    with pytest.raises(UnknownGroupError, match="consumed"):
        source.take("g-old")
    groups = {g["group_id"]: g for g in store.dump("gyre_groups")}
    assert groups["g-old"]["consumed_step"] == 7 and groups["g-old"]["status"] == "consumed"


def test_surplus_is_not_a_member_and_an_overfull_group_is_an_error_that_loses_nothing() -> None:
    log = InMemoryEventLog()
    dispatch_group(log, RUN, "surplus", ["s0", "s1", "s2"], size=2)
    dispatch_group(log, RUN, "overfull", ["o0", "o1", "o2"], size=2)
    runner = EvaluationRunner(log, CallableEvaluator(lambda s: 0.5), EvaluationConfig())
    for e in ("s0", "s1", "o0", "o1", "o2"):
        start(log, e, RUN)
        finish(log, e, RUN)
        runner.preserve(e, "v1")
        runner.settle(e, deadline=INF)
    store = memory_store(log)
    source = StoreGroupSource(log, store)
    assert source.ready_groups() == ()  # s2 is still running
    finish(log, "s2", RUN, FinishReason.SURPLUS)
    [ticket] = source.ready_groups()
    assert ticket.group_id == "surplus"
    assert [e.execution_id for e in source.take("surplus").executions] == ["s0", "s1"]
    groups = {g["group_id"]: g for g in store.dump("gyre_groups")}
    assert groups["overfull"]["status"] == "overfull" and "3 executions" in groups["overfull"]["error"]
    with pytest.raises(UnknownGroupError, match="overfull"):
        source.take("overfull")
    assert {r["execution_id"] for r in store.dump("gyre_rewards")} >= {"o0", "o1", "o2"}


def test_a_rejected_reward_makes_its_group_untrainable() -> None:
    log = InMemoryEventLog()
    dispatch_group(log, RUN, "g", ["x"])
    start(log, "x", RUN)
    finish(log, "x", RUN)
    log.append([new_outcome(RewardAssigned(execution_id="x", run_id=RUN, evaluation_id="nope", reward=1.0,
                                           artifact_version="v1"))])  # fmt: skip
    source = StoreGroupSource(log, memory_store(log))
    [ticket] = source.ready_groups()
    with pytest.raises(GroupNotTrainableError, match="rejected"):
        source.take(ticket.group_id)


def test_rebuild_of_the_evaluation_and_group_projections_equals_the_incremental_result() -> None:
    log = InMemoryEventLog()
    runner = _run(log)
    for e in ("a", "b", "c", "d", "e", "f"):
        finish(log, e, RUN)
        runner.settle(e, deadline=INF)
    live = memory_store(log)
    source = StoreGroupSource(log, live)
    for ticket in source.ready_groups():
        source.take(ticket.group_id)
    catch_all(log, live)
    # Incremental catch-up in small batches versus one rebuild from scratch.
    stepped = memory_store(log)
    for p in projections():
        for until in range(0, log.head() + 1, 17):
            catch_up(log, stepped, p, until=until, batch=3)
        catch_up(log, stepped, p)
    rebuilt = InMemoryProjectionStore(projections().tables(), log)
    for p in projections():
        rebuild(log, rebuilt, p)
    for table in ("gyre_artifacts", "gyre_evaluations", "gyre_rewards", "gyre_groups", "gyre_group_members"):
        assert rebuilt.dump(table) == live.dump(table) == stepped.dump(table), table
    assert np.all([g["status"] == "consumed" for g in live.dump("gyre_groups")])


class _AppendsOnSecondHead(InMemoryEventLog):
    """A log where another writer appends right after the second `head()` call has answered."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = 0
        self.writer: Callable[[], object] | None = None

    def head(self) -> int:
        position = super().head()
        self.heads += 1
        if self.heads == 2 and self.writer is not None:
            self.writer()
        return position


def test_ready_groups_reads_one_cut_of_the_log() -> None:
    log = _AppendsOnSecondHead()
    dispatch_group(log, RUN, "g-cut", ["a"], policy_version=0)
    start(log, "a", RUN)
    finish(log, "a", RUN)
    runner = EvaluationRunner(log, CallableEvaluator(_judge), EvaluationConfig(retry_delay_s=0))
    runner.preserve("a", "v1")
    source = StoreGroupSource(log, memory_store(log), GroupSourceConfig(), step=1)
    # The reward lands while the source catches its projections up: either all three see it
    # or none does, so a ticket always builds.
    log.heads, log.writer = 0, lambda: runner.settle("a", deadline=INF)
    for _ in range(2):
        for ticket in source.ready_groups():
            assert source.build(ticket.group_id).executions[0].advantage == 0.0
    assert [t.group_id for t in source.ready_groups()] == ["g-cut"]


def test_a_step_resumed_takes_back_only_its_own_runs_groups() -> None:
    """A second run in the same database (the demo run twice) must not retake the first run's
    groups of the same step number: it would train on another run's samples."""
    log = InMemoryEventLog()
    log.append(
        [
            NewEvent(GroupConsumed(group_id=f"{run}-g{i}", run_id=run, step=0, trainer="core"))
            for run in ("first", "second")
            for i in range(2)
        ]
    )
    mine = StoreGroupSource(log, memory_store(log), GroupSourceConfig(trainer="core", run_id="second"))
    assert mine.consumed_by_step(0) == ("second-g0", "second-g1")
    assert mine.consumed_by_step(1) == ()


class _TreeOutage:
    """A projection store whose tree reads fail while ``down`` (an outage mid-load)."""

    def __init__(self, store: InMemoryProjectionStore) -> None:
        self._store = store
        self.down = False

    def select(self, table: str, column: str, value: object) -> list[dict[str, object]]:
        if self.down and table in ("gyre_tree_nodes", "gyre_tree_state"):
            raise StoreUnavailable("connection refused")
        return self._store.select(table, column, value)

    def select_in(
        self, table: str, column: str, value: object, among: str, keys: list[object]
    ) -> list[dict[str, object]]:
        if self.down and table == "gyre_tree_nodes":
            raise StoreUnavailable("connection refused")
        return self._store.select_in(table, column, value, among, keys)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def test_an_outage_while_a_tree_loads_propagates_and_consumes_nothing() -> None:
    log = InMemoryEventLog()
    runner = _run(log)
    store = _TreeOutage(memory_store(log))
    source = StoreGroupSource(log, store, GroupSourceConfig(), step=1)  # type: ignore[arg-type]
    _finish_new_group(log, runner, FinishReason.COMPLETED)
    [ticket] = source.ready_groups()
    store.down = True
    # Before: the error became "no tree", and valid executions trained with no rows (L_i = 0).
    with pytest.raises(StoreUnavailable):
        source.take(ticket.group_id)
    assert not [r for r in log.read(0, types=["group.consumed"]) if isinstance(r.event, GroupConsumed)]
    store.down = False
    [again] = source.ready_groups()  # the group waited, ready as before
    taken = source.take(again.group_id)
    assert taken.executions[0].rows and taken.executions[1].rows


def test_an_execution_with_no_tree_gives_no_rows() -> None:
    store = memory_store(InMemoryEventLog())
    assert execution_rows(store, "never-called", GroupSourceConfig()) == ()
    with pytest.raises(NoTrajectoryTree):
        TreeView.load(store, "never-called")
