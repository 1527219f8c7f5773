"""Projections of evaluation and rollout groups: artifacts, evaluations, outcomes, group readiness.

``EvaluationsProjection`` keeps every evaluation (never overwritten) and each execution's one
outcome; ``GroupsProjection`` tracks the N executions of each group and marks the group ready
once every member has closed with a decided outcome. Neither computes advantages or admits
trajectories (gyre_train does); both must accept whatever is already in the log, so bad input
is recorded as an error state on the row instead of being refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from gyre_store import schema
from gyre_store.catalog import (
    ArtifactPreserved,
    EvaluationFailed,
    EvaluationRecorded,
    EvaluationStatus,
    ExecutionDispatched,
    ExecutionExcluded,
    ExecutionFinished,
    FinishReason,
    GroupConsumed,
    GroupDispatched,
    PlaceholderInserted,
    RewardAssigned,
)
from gyre_store.log import RecordedEvent
from gyre_store.projections.base import Projection, ProjectionSet, Row, RowStore

ARTIFACTS, EVALUATIONS, REWARDS = "gyre_artifacts", "gyre_evaluations", "gyre_rewards"
GROUPS, MEMBERS = "gyre_groups", "gyre_group_members"


class OutcomeStatus:
    """Values of ``gyre_rewards.status`` and ``gyre_group_members.outcome``."""

    VALID = "valid"
    PLACEHOLDER = "placeholder"
    EXCLUDED = "excluded"
    REJECTED = "rejected"  # an outcome event that contradicts the evaluations it names


class GroupStatus:
    """Values of ``gyre_groups.status``."""

    OPEN = "open"
    READY = "ready"
    CONSUMED = "consumed"
    OVERFULL = "overfull"


class EvaluationsProjection(Projection):
    """``gyre_artifacts``, ``gyre_evaluations`` (append-only) and ``gyre_rewards`` (first outcome)."""

    name: ClassVar[str] = "evaluations"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.artifacts, schema.evaluations, schema.rewards)
    event_types: ClassVar[frozenset[str]] = frozenset(
        {
            "artifact.preserved",
            "evaluation.recorded",
            "evaluation.failed",
            "reward.assigned",
            "reward.placeholder",
            "reward.excluded",
        }
    )

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        ev = event.event
        if isinstance(ev, ArtifactPreserved):
            if rows.get(ARTIFACTS, ev.execution_id, ev.artifact_version) is None:
                rows.put(
                    ARTIFACTS,
                    {
                        "execution_id": ev.execution_id,
                        "artifact_version": ev.artifact_version,
                        "run_id": ev.run_id,
                        "branch_refs": list(ev.branch_refs),
                        "location": ev.location,
                        "preserved_position": event.position,
                    },
                )
        elif isinstance(ev, EvaluationRecorded | EvaluationFailed):
            self._evaluation(rows, event.position, ev)
        else:
            self._outcome(rows, event.position, ev)

    @staticmethod
    def _evaluation(rows: RowStore, position: int, ev: EvaluationRecorded | EvaluationFailed) -> None:
        if rows.get(EVALUATIONS, ev.evaluation_id) is not None:
            return  # later evaluations never overwrite earlier ones, even under a reused id
        row: Row = {
            "evaluation_id": ev.evaluation_id,
            "execution_id": ev.execution_id,
            "run_id": ev.run_id,
            "attempt": ev.attempt,
            "evaluator": ev.evaluator,
            "artifact_version": ev.artifact_version,
            "branch_refs": [],
            "status": "failed",
            "error_kind": None,
            "score": None,
            "score_low": None,
            "score_high": None,
            "finish_reason": None,
            "critique": "",
            "detail": ev.detail,
            "position": position,
        }
        if isinstance(ev, EvaluationFailed):
            row["error_kind"] = ev.kind.value
        else:
            row.update(
                branch_refs=list(ev.branch_refs),
                status=ev.status.value,
                score=ev.score,
                score_low=ev.score_low,
                score_high=ev.score_high,
                finish_reason=None if ev.finish_reason is None else ev.finish_reason.value,
                critique=ev.critique,
            )
            problem = _evaluation_problem(rows, ev)
            if problem is not None:
                # Written past the evaluation runner's checks: kept for the audit, never a reward.
                row.update(status=OutcomeStatus.REJECTED, error_kind=problem[0], detail=problem[1])
        rows.put(EVALUATIONS, row)

    @staticmethod
    def _outcome(rows: RowStore, position: int, ev: Any) -> None:
        prior = rows.get(REWARDS, ev.execution_id)
        if prior is not None and prior["status"] != OutcomeStatus.REJECTED:
            return  # an execution's outcome is decided once
        row: Row = {
            "execution_id": ev.execution_id,
            "run_id": ev.run_id,
            "status": OutcomeStatus.VALID,
            "reward": None,
            "evaluation_id": None,
            "artifact_version": None,
            "branch_refs": None,
            "reason": "",
            "attempts": None,
            "error": None,
            "position": position,
        }
        if isinstance(ev, RewardAssigned):
            row.update(
                reward=ev.reward,
                evaluation_id=ev.evaluation_id,
                artifact_version=ev.artifact_version,
                branch_refs=list(ev.branch_refs),
                reason="evaluated",
            )
            evaluation = rows.get(EVALUATIONS, ev.evaluation_id)
            error = _reward_problem(evaluation, ev)
            if error is not None:
                row.update(status=OutcomeStatus.REJECTED, error=error)
        elif isinstance(ev, PlaceholderInserted):
            row.update(
                status=OutcomeStatus.PLACEHOLDER, reward=0.0, reason=ev.reason, evaluation_id=ev.evaluation_id
            )
        else:
            assert isinstance(ev, ExecutionExcluded)
            row.update(
                status=OutcomeStatus.EXCLUDED,
                reason=ev.reason.value,
                attempts=ev.attempts,
                error=ev.last_error,
            )
        rows.put(REWARDS, row)


def _evaluation_problem(rows: RowStore, ev: EvaluationRecorded) -> tuple[str, str] | None:
    if rows.get(ARTIFACTS, ev.execution_id, ev.artifact_version) is None:
        return (
            "unknown_artifact",
            f"artifact version {ev.artifact_version!r} of {ev.execution_id} was never preserved",
        )
    if ev.status == EvaluationStatus.VALID:
        if ev.score is None:
            return "malformed_result", "a valid evaluation without a score"
        if not ev.score_low <= ev.score <= ev.score_high:
            return "score_out_of_range", f"score {ev.score} outside [{ev.score_low}, {ev.score_high}]"
    return None


def _reward_problem(evaluation: Row | None, ev: RewardAssigned) -> str | None:
    if evaluation is None:
        return f"reward names unknown evaluation {ev.evaluation_id!r}"
    if evaluation["execution_id"] != ev.execution_id:
        return f"reward names evaluation {ev.evaluation_id!r} of another execution"
    if evaluation["status"] != EvaluationStatus.VALID.value:
        return f"reward names a {evaluation['status']} evaluation"
    if evaluation["score"] != ev.reward or evaluation["artifact_version"] != ev.artifact_version:
        return "reward differs from the score or artifact version of its evaluation"
    return None


def _empty_group(group_id: str, run_id: str) -> Row:
    return {
        "group_id": group_id,
        "run_id": run_id,
        "query_id": "",
        "size": 0,
        "policy_version": 0,
        "dispatched": 0,
        "surplus": 0,
        "closed": 0,
        "valid": 0,
        "placeholders": 0,
        "excluded": 0,
        "status": GroupStatus.OPEN,
        "error": None,
        "ready_position": None,
        "consumed_step": None,
        "consumed_position": None,
    }


_OUTCOME_COLUMN = {
    OutcomeStatus.VALID: "valid",
    OutcomeStatus.PLACEHOLDER: "placeholders",
    OutcomeStatus.EXCLUDED: "excluded",
}


def _contribution(member: Row | None) -> dict[str, int]:
    """What one member adds to its group's counters."""
    counts = {"dispatched": 0, "surplus": 0, "closed": 0, "valid": 0, "placeholders": 0, "excluded": 0}
    if member is None:
        return counts
    counts["dispatched"] = 1
    if member["finish_reason"] == FinishReason.SURPLUS.value:
        counts["surplus"] = 1  # surplus under oversampling: not one of the N
        return counts
    if member["finish_reason"] is not None:
        counts["closed"] = 1
    column = _OUTCOME_COLUMN.get(member["outcome"])
    if column is not None:
        counts[column] = 1
    return counts


class GroupsProjection(Projection):
    """``gyre_groups`` (counters, readiness, consumption) and ``gyre_group_members``."""

    name: ClassVar[str] = "groups"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.groups, schema.group_members)
    event_types: ClassVar[frozenset[str]] = frozenset(
        {
            "group.dispatched",
            "group.consumed",
            "execution.dispatched",
            "execution.finished",
            "reward.assigned",
            "reward.placeholder",
            "reward.excluded",
        }
    )

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        ev = event.event
        if isinstance(ev, GroupDispatched):
            group = rows.get(GROUPS, ev.group_id) or _empty_group(ev.group_id, ev.run_id)
            group.update(query_id=ev.query_id, size=ev.size, policy_version=ev.policy_version)
            self._settle(rows, group, event.position)
            return
        if isinstance(ev, GroupConsumed):
            group = rows.get(GROUPS, ev.group_id) or _empty_group(ev.group_id, ev.run_id)
            if group["status"] != GroupStatus.READY and group["consumed_step"] is None:
                group["error"] = f"consumed while {group['status']}"
            if group["consumed_step"] is None:
                group.update(
                    status=GroupStatus.CONSUMED, consumed_step=ev.step, consumed_position=event.position
                )
            rows.put(GROUPS, group)
            return
        if isinstance(ev, ExecutionDispatched):
            if rows.get(MEMBERS, ev.execution_id) is not None:
                return
            member: Row = {
                "execution_id": ev.execution_id,
                "group_id": ev.group_id,
                "run_id": ev.run_id,
                "policy_version": ev.policy_version,
                "finish_reason": None,
                "outcome": None,
                "reward": None,
                "dispatched_position": event.position,
            }
            self._change(rows, None, member, event.position)
            return
        before = rows.get(MEMBERS, getattr(ev, "execution_id"))  # noqa: B009 - every other type has one
        if before is None:
            return  # not dispatched into a group: nothing to count
        after = dict(before)
        if isinstance(ev, ExecutionFinished):
            if before["finish_reason"] is not None:
                return
            after["finish_reason"] = ev.reason.value
        elif before["outcome"] is not None:
            return  # the first outcome stands
        elif isinstance(ev, RewardAssigned):
            after.update(outcome=OutcomeStatus.VALID, reward=ev.reward)
        elif isinstance(ev, PlaceholderInserted):
            after.update(outcome=OutcomeStatus.PLACEHOLDER, reward=0.0)
        elif isinstance(ev, ExecutionExcluded):
            after.update(outcome=OutcomeStatus.EXCLUDED, reward=None)
        self._change(rows, before, after, event.position)

    def _change(self, rows: RowStore, before: Row | None, after: Row, position: int) -> None:
        rows.put(MEMBERS, after)
        group = rows.get(GROUPS, after["group_id"]) or _empty_group(after["group_id"], after["run_id"])
        old, new = _contribution(before), _contribution(after)
        for column in old:
            group[column] += new[column] - old[column]
        self._settle(rows, group, position)

    @staticmethod
    def _settle(rows: RowStore, group: Row, position: int) -> None:
        if group["status"] != GroupStatus.CONSUMED:
            members = group["dispatched"] - group["surplus"]
            all_closed = group["closed"] + group["surplus"] == group["dispatched"]
            decided = group["valid"] + group["placeholders"] + group["excluded"]
            if group["size"] and all_closed and members > group["size"]:
                group.update(
                    status=GroupStatus.OVERFULL,
                    error=f"{members} executions closed in a group of N={group['size']} (surplus excluded)",
                )
            elif group["size"] and all_closed and members == group["size"] and decided == members:
                group["status"] = GroupStatus.READY
                if group["ready_position"] is None:
                    group["ready_position"] = position
            else:
                group.update(status=GroupStatus.OPEN, ready_position=None)
        rows.put(GROUPS, group)


def evaluation_projections() -> ProjectionSet:
    """The projections of this module, ready to maintain or rebuild."""
    return ProjectionSet([EvaluationsProjection(), GroupsProjection()])
