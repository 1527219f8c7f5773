"""Evaluation, rewards, groups and consumption on real PostgreSQL; every documented audit query run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from gyre_store import FinishReason, PostgresEventLog, PostgresProjectionStore, catch_up, rebuild
from gyre_store.catalog import ModelCallRecorded, Provenance, TitoArrays, new_record
from gyre_train import (
    AdmissionConfig,
    BatchPacker,
    CallableEvaluator,
    EvaluationConfig,
    EvaluationRunner,
    GroupSourceConfig,
    PackingConfig,
    PreservedState,
    StoreGroupSource,
)
from tests.unit.train.runs import dispatch_group, finish, projections, record_trace, start

DOC = Path(__file__).resolve().parents[3] / "docs" / "evaluation-and-audit.md"
RUN = "audit-run"
SCORES = {("e0", "commit-a1"): 1.0, ("e1", "commit-b1"): 0.1, ("e1", "commit-b2"): 0.25, ("e4", "w"): 0.5,
          ("e5", "w"): 0.0, ("e6", "w"): 0.75}  # fmt: skip
MAIN, WIP = "refs/heads/main", "refs/heads/wip"


def _judge(state: PreservedState) -> float:
    if state.execution_id == "audit-e3":
        raise RuntimeError("grader down")
    return SCORES[(state.execution_id.removeprefix("audit-"), state.artifact_version)]


def _critique_record(log: PostgresEventLog, execution_id: str) -> None:
    def arrays(inp: list[tuple[int, Provenance]], out: list[int]) -> TitoArrays:
        return TitoArrays(
            input_ids=np.array([t for t, _ in inp], "<i4"), input_prov=np.array([p for _, p in inp], "|u1"),
            msg_ends=np.zeros(0, "<i4"), msg_hashes=np.zeros(0, "<u4"), output_ids=np.array(out, "<i4"),
            output_logprobs=np.full(len(out), -0.3, "<f4"), output_prov=np.full(len(out), Provenance.SAMPLED, "|u1"),
            output_trainable=np.ones(len(out), np.bool_), output_hash=np.zeros(0, "<u4"),
        )  # fmt: skip

    first = ModelCallRecorded(execution_id=execution_id, run_id=RUN, request_id="r1")
    log.append([new_record(first, arrays([(1, Provenance.SYSTEM), (2, Provenance.USER)], [10, 11]))])
    second = ModelCallRecorded(
        execution_id=execution_id, run_id=RUN, request_id="r2", prefix_of="r1", prefix_len=4
    )
    critique = [(50, Provenance.CRITIQUE), (51, Provenance.CRITIQUE), (52, Provenance.CRITIQUE)]
    log.append([new_record(second, arrays([*critique, (3, Provenance.USER)], [12]))])


def _record_run(log: PostgresEventLog) -> tuple[StoreGroupSource, PostgresProjectionStore]:
    ids = {k: f"audit-e{k}" for k in range(7)}
    dispatch_group(log, RUN, "audit-g0", [ids[0], ids[1], ids[2]], policy_version=0)
    dispatch_group(log, RUN, "audit-g1", [ids[3], ids[4], ids[5]], policy_version=0)
    dispatch_group(log, RUN, "audit-g2", [ids[6]], policy_version=1)
    for k in (0, 1, 3, 4, 5, 6):
        start(log, ids[k], RUN)
    record_trace(log, ids[0], RUN, seed=5)
    record_trace(log, ids[1], RUN, seed=6)
    _critique_record(log, ids[5])
    for k, reason in ((0, FinishReason.COMPLETED), (1, FinishReason.HARNESS_TIMEOUT), (2, FinishReason.FAILED),
                      (3, FinishReason.COMPLETED), (4, FinishReason.COMPLETED), (5, FinishReason.COMPLETED),
                      (6, FinishReason.COMPLETED)):  # fmt: skip
        finish(log, ids[k], RUN, reason)
    runner = EvaluationRunner(
        log, CallableEvaluator(_judge, name="judge"), EvaluationConfig(max_attempts=2, retry_delay_s=0)
    )
    runner.preserve(ids[0], "commit-a1", branch_refs=[MAIN], location="/ws/e0")
    runner.preserve(ids[1], "commit-b1", branch_refs=[WIP])
    runner.evaluate(ids[1])  # an intermediate artifact, evaluated while the work went on
    runner.preserve(ids[1], "commit-b2", branch_refs=[MAIN, WIP])
    for k in (3, 4, 5, 6):
        runner.preserve(ids[k], "w", branch_refs=[MAIN])
    for k in range(7):
        runner.settle(ids[k], deadline=float("inf"))
    store = PostgresProjectionStore(log.pool, projections().tables())
    return StoreGroupSource(log, store, GroupSourceConfig(AdmissionConfig(max_trajectories=5)), step=1), store


def _examples() -> dict[str, str]:
    found = dict(re.findall(r"```sql\n-- audit: (\S+)\n(.*?)```", DOC.read_text(), flags=re.S))
    assert len(found) == 8, sorted(found)
    return found


EXPECTED: dict[str, list[tuple[Any, ...]]] = {
    "step-rewards": [
        ("audit-g0", "audit-e0", "valid", 1.0, "audit-e0:1", "judge", "commit-a1", [MAIN]),
        ("audit-g0", "audit-e1", "valid", 0.25, "audit-e1:2", "judge", "commit-b2", [MAIN, WIP]),
        ("audit-g0", "audit-e2", "placeholder", 0.0, None, None, None, None),
        ("audit-g1", "audit-e3", "excluded", None, None, None, None, None),
        ("audit-g1", "audit-e4", "valid", 0.5, "audit-e4:1", "judge", "w", [MAIN]),
        ("audit-g1", "audit-e5", "valid", 0.0, "audit-e5:1", "judge", "w", [MAIN]),
    ],
    "partial-rewards": [("audit-e1", "harness_timeout", 0.25, "commit-b2", "audit-e1:2")],
    "excluded": [("audit-e3", "attempts_exhausted", 2, 2, "evaluator_error", "RuntimeError: grader down")],
    "placeholders": [("audit-e2", "audit-g0", "environment never started")],
    "critique": [("audit-e5", "r2", 3, 0)],
    "evaluation-history": [
        ("audit-e1:1", 1, "commit-b1", [WIP], "valid", None, 0.1),
        ("audit-e1:2", 2, "commit-b2", [MAIN, WIP], "valid", None, 0.25),
    ],
    "provenance": [
        ("audit-e0", "audit-g0", "valid", 1.0, "judge", "commit-a1", "completed", False, 1),
        ("audit-e1", "audit-g0", "valid", 0.25, "judge", "commit-b2", "harness_timeout", True, 1),
        ("audit-e2", "audit-g0", "placeholder", 0.0, None, None, "failed", False, 1),
        ("audit-e3", "audit-g1", "excluded", None, None, None, "completed", False, 1),
        ("audit-e4", "audit-g1", "valid", 0.5, "judge", "w", "completed", False, 1),
        ("audit-e5", "audit-g1", "valid", 0.0, "judge", "w", "completed", False, 1),
        ("audit-e6", "audit-g2", "valid", 0.75, "judge", "w", "completed", False, None),
    ],
}


def test_rewards_are_traceable_in_sql_through_every_documented_query(
    pg_log: PostgresEventLog, database_url: str
) -> None:
    source, store = _record_run(pg_log)
    packer = BatchPacker(PackingConfig(token_budget=200_000, groups_per_batch=2, executions_per_group=3), 0)
    steps = packer.pull(source)
    assert [g.group_id for g in packer.groups] == ["audit-g0", "audit-g1"] and steps[-1].closes_stream
    [e5] = [e for e in packer.groups[1].executions if e.execution_id == "audit-e5"]
    assert [r.token_ids[r.target_mask].tolist() for r in e5.rows] == [[10, 11, 12]]  # no critique target
    for p in projections():
        catch_up(pg_log, store, p)  # the consumption events

    ready_position = store.select("gyre_groups", "group_id", "audit-g2")[0]["ready_position"]
    expected = {**EXPECTED, "ready-groups": [("audit-g2", 1, 1, 0, 0, ready_position)]}
    with psycopg.connect(database_url) as conn:
        for name, query in _examples().items():
            rows = conn.execute(query).fetchall()  # type: ignore[call-overload]
            assert rows == expected[name], name


def test_rebuilt_projections_equal_the_live_ones_and_the_auditor_reads_the_views(
    pg_log: PostgresEventLog, database_url: str
) -> None:
    source, live = _record_run(pg_log)
    for ticket in source.ready_groups():
        source.take(ticket.group_id)
    for p in projections():
        catch_up(pg_log, live, p)
    replica = PostgresProjectionStore(pg_log.pool, projections().tables(), schema="rebuilt")
    replica.create_schema()
    for p in projections():
        rebuild(pg_log, replica, p)
    for table in projections().tables():
        assert replica.dump(table) == live.dump(table), table
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET ROLE gyre_auditor")
        for view in ("gyre_step_rewards_v", "gyre_reward_provenance_v", "gyre_partial_rewards_v",
                     "gyre_excluded_executions_v", "gyre_placeholders_v", "gyre_critique_tokens_v"):  # fmt: skip
            assert conn.execute(f"SELECT count(*) FROM {view}").fetchone()[0] >= 1, view  # type: ignore[index]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM gyre_rewards")
