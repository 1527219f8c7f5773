"""Event types of evaluation and rewards: preserved artifacts, evaluations, outcomes, consumption.

An execution's reward is traceable to exactly one evaluation, which names the artifact version
and branch references it scored. Evaluations are appended, never replaced; the outcome of an
execution (a reward, a zero placeholder, or an exclusion) is decided once, by an idempotency key
shared by the three outcome types. Evaluator logic lives in gyre_train; this module only defines
what is recorded.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from gyre_store.catalog.registry import REGISTRY, Ident, NonNegative
from gyre_store.catalog.run import FinishReason
from gyre_store.log import Event, EventMetadata, NewEvent

Score = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]
BranchRefs = tuple[str, ...]


class EvaluationStatus(enum.StrEnum):
    """The validity an evaluator reported for the state it looked at."""

    VALID = "valid"  # a score under the task's rules, including a valid zero and partial progress
    NOT_EVALUABLE = "not_evaluable"  # no evaluable work at all (a total failure)


class EvaluationErrorKind(enum.StrEnum):
    """Why an evaluation attempt produced no usable result; the evaluation stays pending."""

    EVALUATOR_ERROR = "evaluator_error"  # the evaluator raised or its command failed
    MALFORMED_RESULT = "malformed_result"  # it returned something that is not a result
    SCORE_OUT_OF_RANGE = "score_out_of_range"  # the score lies outside the task's range
    UNKNOWN_ARTIFACT = "unknown_artifact"  # it names an artifact version never preserved
    UNKNOWN_EXECUTION = "unknown_execution"  # the execution was never dispatched


class ExclusionReason(enum.StrEnum):
    """Why an execution has no reward and is left out of training."""

    BUDGET_EXHAUSTED = "budget_exhausted"  # its time budget ran out with the evaluation pending
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # the configured attempts ran out first


@REGISTRY.register("artifact.preserved", stream="artifact", key="execution_id")
class ArtifactPreserved(Event, frozen=True, kw_only=True):
    """A state of an execution's work kept for evaluation (a workspace snapshot, a commit)."""

    execution_id: Ident
    run_id: Ident
    artifact_version: Ident
    branch_refs: BranchRefs = ()
    location: str = ""  # where the preserved state lives (a path or URI) for evaluators


@REGISTRY.register("evaluation.recorded", stream="evaluation", key="execution_id")
class EvaluationRecorded(Event, frozen=True, kw_only=True):
    """One evaluation result, bound to its execution, artifact version and branch references."""

    evaluation_id: Ident
    execution_id: Ident
    run_id: Ident
    attempt: NonNegative
    evaluator: str
    artifact_version: Ident
    branch_refs: BranchRefs = ()
    status: EvaluationStatus
    score: Score | None = None  # None unless VALID
    score_low: Score = 0.0
    score_high: Score = 1.0
    finish_reason: FinishReason | None = None  # how the execution closed (None: evaluated while open)
    critique: str = ""
    detail: str = ""


@REGISTRY.register("evaluation.requested", stream="evaluation", key="execution_id")
class EvaluationRequested(Event, frozen=True, kw_only=True):
    """A running execution asked for an evaluation of its current work (an artifact it preserved);
    the answer is the ``evaluation.recorded`` of that artifact, whose critique goes back to it."""

    execution_id: Ident
    run_id: Ident
    artifact_version: Ident


@REGISTRY.register("evaluation.failed", stream="evaluation", key="execution_id")
class EvaluationFailed(Event, frozen=True, kw_only=True):
    """An evaluation attempt that produced no usable result; recorded, never a zero."""

    evaluation_id: Ident
    execution_id: Ident
    run_id: Ident
    attempt: NonNegative
    evaluator: str
    artifact_version: str = ""
    kind: EvaluationErrorKind
    detail: str = ""


@REGISTRY.register("evaluation.refused", stream="evaluation", key="execution_id")
class EvaluationRefused(Event, frozen=True, kw_only=True):
    """An execution's ask for an evaluation that was refused before anything was read: it named
    a ``location`` other than the snapshot folder the run recorded for it (``reason`` says
    which). Nothing is preserved or evaluated; the execution goes on."""

    execution_id: Ident
    run_id: Ident
    artifact_version: str = ""
    location: str = ""
    reason: str


@REGISTRY.register("reward.assigned", stream="evaluation", key="execution_id")
class RewardAssigned(Event, frozen=True, kw_only=True):
    """The execution's reward is the score of ``evaluation_id`` (never time, length or status)."""

    execution_id: Ident
    run_id: Ident
    evaluation_id: Ident
    reward: Score
    artifact_version: Ident
    branch_refs: BranchRefs = ()


@REGISTRY.register("reward.placeholder", stream="evaluation", key="execution_id")
class PlaceholderInserted(Event, frozen=True, kw_only=True):
    """A total failure left nothing evaluable: a zero-reward placeholder keeps the group complete."""

    execution_id: Ident
    run_id: Ident
    reason: str
    evaluation_id: str | None = None  # the NOT_EVALUABLE evaluation, when one was made


@REGISTRY.register("reward.excluded", stream="evaluation", key="execution_id")
class ExecutionExcluded(Event, frozen=True, kw_only=True):
    """No valid reward within the budget: the execution is left out of training (not a zero)."""

    execution_id: Ident
    run_id: Ident
    reason: ExclusionReason
    attempts: NonNegative
    last_error: str = ""


@REGISTRY.register("group.consumed", stream="group", key="group_id")
class GroupConsumed(Event, frozen=True, kw_only=True):
    """A training step took a ready group; its rewards are the ones used by that step."""

    group_id: Ident
    run_id: Ident
    step: NonNegative
    trainer: str = ""
    trajectories: NonNegative = 0  # trajectories admitted over the group's executions
    target_tokens: NonNegative = 0  # their trainable target tokens, sum of L_i


Outcome = RewardAssigned | PlaceholderInserted | ExecutionExcluded


def outcome_key(execution_id: str) -> str:
    """The idempotency key all three outcome types share: an execution's outcome is decided once."""
    return f"outcome:{execution_id}"


def new_outcome(event: Outcome, *, metadata: EventMetadata | None = None) -> NewEvent:
    """A NewEvent for an outcome; appending a second outcome of the same execution is a no-op."""
    return NewEvent(
        event, idempotency_key=outcome_key(event.execution_id), metadata=metadata or EventMetadata()
    )


def consumption_key(group_id: str) -> str:
    """The idempotency key of a group's consumption: a group is trained on once."""
    return f"consumed:{group_id}"
