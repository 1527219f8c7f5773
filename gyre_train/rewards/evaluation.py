"""Evaluation outcomes into rewards (paper, "Partial scoring"): the evaluator seam and its runner.

An ``Evaluator`` sees only an execution's preserved state (never its elapsed time, length or how
it closed) and returns a score, a validity status and the artifact version it evaluated. The
``EvaluationRunner`` runs it after an execution closes, including after a timeout; a failed
attempt leaves the evaluation pending and is retried on the same preserved state until the
execution's budget runs out, which excludes the execution (a pending evaluation is not a zero).
Nothing evaluable at all (the environment never started) becomes a zero-reward placeholder.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gyre_store import (
    ArtifactPreserved,
    EvaluationErrorKind,
    EvaluationFailed,
    EvaluationRecorded,
    EvaluationStatus,
    EventLog,
    ExclusionReason,
    ExecutionDispatched,
    ExecutionExcluded,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    NewEvent,
    PlaceholderInserted,
    RewardAssigned,
    StreamId,
    new_outcome,
)
from gyre_train.exceptions import (
    ExecutionNotClosedError,
    InvalidConfigError,
    InvalidEvaluationError,
    UnknownExecutionError,
)
from gyre_train.rewards.advantages import RewardStatus


@dataclass(frozen=True, slots=True)
class PreservedState:
    """What an evaluator may look at: one preserved artifact of an execution."""

    execution_id: str
    run_id: str
    artifact_version: str
    branch_refs: tuple[str, ...]
    location: str  # a workspace path or URI


@dataclass(frozen=True, slots=True)
class EvaluationResult:
    """An evaluator's answer: a score (VALID only), its validity, and the artifact it evaluated."""

    score: float | None
    status: EvaluationStatus
    artifact_version: str
    critique: str = ""
    detail: str = ""


class Evaluator(Protocol):
    """Scores a preserved state; raises on failure (any exception leaves the evaluation pending)."""

    @property
    def name(self) -> str: ...

    def evaluate(self, state: PreservedState) -> EvaluationResult: ...


@dataclass(frozen=True, slots=True)
class EvaluationConfig:
    """The task's score range, the attempt cap (None: until the budget ends) and the retry delay."""

    score_low: float = 0.0
    score_high: float = 1.0
    max_attempts: int | None = 3
    retry_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.score_low) and math.isfinite(self.score_high)):
            raise InvalidConfigError("the score range must be finite")
        if self.score_low > self.score_high:
            raise InvalidConfigError(f"score range [{self.score_low}, {self.score_high}] is empty")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidConfigError(f"max_attempts must be >= 1 or None, got {self.max_attempts}")
        if self.retry_delay_s < 0:
            raise InvalidConfigError(f"retry_delay_s must be >= 0, got {self.retry_delay_s}")


class Clock(Protocol):
    """Time as the runner sees it (seconds on any monotonic scale); tests pass a fake."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """``time.monotonic`` and ``time.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True, slots=True)
class EvaluationOutcome:
    """How an execution's outcome was decided: reward and status, the evaluation behind it."""

    execution_id: str
    status: RewardStatus
    reward: float | None  # None when excluded
    evaluation_id: str | None
    attempts: int
    reason: str


def check_result(result: object, config: EvaluationConfig, known_versions: Sequence[str]) -> EvaluationResult:
    """Return ``result`` if it can be recorded as an evaluation; raise InvalidEvaluationError otherwise."""
    if not isinstance(result, EvaluationResult) or not isinstance(result.status, EvaluationStatus):
        raise InvalidEvaluationError(
            EvaluationErrorKind.MALFORMED_RESULT, f"expected an EvaluationResult, got {result!r:.200}"
        )
    if result.status == EvaluationStatus.VALID:
        score = result.score
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise InvalidEvaluationError(
                EvaluationErrorKind.MALFORMED_RESULT, f"a valid result needs a finite score, got {score!r}"
            )
        if not config.score_low <= score <= config.score_high:
            raise InvalidEvaluationError(
                EvaluationErrorKind.SCORE_OUT_OF_RANGE,
                f"score {score} is outside the task's range [{config.score_low}, {config.score_high}]",
            )
    elif result.score is not None:
        raise InvalidEvaluationError(
            EvaluationErrorKind.MALFORMED_RESULT, f"a {result.status.value} result carries a score"
        )
    if result.artifact_version not in known_versions:
        raise InvalidEvaluationError(
            EvaluationErrorKind.UNKNOWN_ARTIFACT,
            f"artifact version {result.artifact_version!r} was never preserved (known: {list(known_versions)})",
        )
    return result


@dataclass(frozen=True, slots=True)
class _Facts:
    run_id: str
    started: bool
    finish: FinishReason | None
    artifacts: tuple[ArtifactPreserved, ...]
    evaluations: int  # evaluation events recorded so far (numbering of the next one)
    outcome: EvaluationOutcome | None


class EvaluationRunner:
    """Evaluates closed executions and records evaluations and outcomes in the event log."""

    def __init__(
        self,
        log: EventLog,
        evaluator: Evaluator,
        config: EvaluationConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._log = log
        self._evaluator = evaluator
        self._config = config or EvaluationConfig()
        self._clock = clock or MonotonicClock()

    def preserve(
        self, execution_id: str, artifact_version: str, *, branch_refs: Sequence[str] = (), location: str = ""
    ) -> None:
        """Record a preserved artifact of a known execution (idempotent per version)."""
        facts = self._facts(execution_id)
        event = ArtifactPreserved(
            execution_id=execution_id,
            run_id=facts.run_id,
            artifact_version=artifact_version,
            branch_refs=tuple(branch_refs),
            location=location,
        )
        self._log.append([NewEvent(event, idempotency_key=f"artifact:{execution_id}:{artifact_version}")])

    def evaluate(self, execution_id: str, artifact_version: str | None = None) -> EvaluationRecorded:
        """Evaluate one preserved artifact (default: the latest) and record it, deciding nothing.

        Raises InvalidEvaluationError (recorded as a failed evaluation) or, for evaluator errors,
        the evaluator's exception after recording it.
        """
        facts = self._facts(execution_id)
        state = self._state(facts, execution_id, artifact_version)
        event, _ = self._attempt(facts, state)
        if isinstance(event, EvaluationFailed):
            raise InvalidEvaluationError(event.kind, event.detail)
        return event

    def settle(self, execution_id: str, *, deadline: float) -> EvaluationOutcome:
        """Decide a closed execution's outcome, retrying failed evaluations until ``deadline``.

        ``deadline`` is the end of the execution's time budget on the runner's clock. Returns the
        outcome already recorded if there is one. Raises UnknownExecutionError (recorded),
        ExecutionNotClosedError, or InvalidEvaluationError for a surplus execution.
        """
        facts = self._facts(execution_id)
        if facts.outcome is not None:
            return facts.outcome
        if facts.finish is None:
            raise ExecutionNotClosedError(f"execution {execution_id} is still running")
        if facts.finish == FinishReason.SURPLUS:
            raise InvalidEvaluationError(
                EvaluationErrorKind.UNKNOWN_EXECUTION,
                f"execution {execution_id} was surplus under oversampling and is not a group member",
            )
        if not facts.artifacts:
            reason = "environment never started" if not facts.started else "no preserved artifact"
            return self._decide(
                PlaceholderInserted(execution_id=execution_id, run_id=facts.run_id, reason=reason)
            )
        state = self._state(facts, execution_id, None)
        attempts, last_error = 0, ""
        cap = self._config.max_attempts
        while self._clock.now() < deadline and (cap is None or attempts < cap):
            attempts += 1
            event, error = self._attempt(facts, state)
            if isinstance(event, EvaluationRecorded):
                if event.status == EvaluationStatus.VALID:
                    assert event.score is not None  # check_result guarantees it
                    outcome: RewardAssigned | PlaceholderInserted = RewardAssigned(
                        execution_id=execution_id,
                        run_id=facts.run_id,
                        evaluation_id=event.evaluation_id,
                        reward=event.score,
                        artifact_version=event.artifact_version,
                        branch_refs=event.branch_refs,
                    )
                else:
                    outcome = PlaceholderInserted(
                        execution_id=execution_id,
                        run_id=facts.run_id,
                        reason="nothing evaluable",
                        evaluation_id=event.evaluation_id,
                    )
                return self._decide(outcome)
            last_error = error
            facts = self._facts(execution_id)
            pause = min(self._config.retry_delay_s, deadline - self._clock.now())
            if pause > 0 and (cap is None or attempts < cap):
                self._clock.sleep(pause)
        reason = (
            ExclusionReason.ATTEMPTS_EXHAUSTED
            if cap is not None and attempts >= cap
            else ExclusionReason.BUDGET_EXHAUSTED
        )
        return self._decide(
            ExecutionExcluded(
                execution_id=execution_id,
                run_id=facts.run_id,
                reason=reason,
                attempts=attempts,
                last_error=last_error[:2000],
            )
        )

    # -- internals ---------------------------------------------------------------------------------
    def _attempt(
        self, facts: _Facts, state: PreservedState
    ) -> tuple[EvaluationRecorded | EvaluationFailed, str]:
        attempt = facts.evaluations + 1
        evaluation_id = f"{state.execution_id}:{attempt}"
        name = self._evaluator.name
        event: EvaluationRecorded | EvaluationFailed
        try:
            raw = self._evaluator.evaluate(state)
            result = check_result(raw, self._config, [a.artifact_version for a in facts.artifacts])
        except Exception as exc:  # an evaluator is plug-in code: any failure leaves it pending
            if isinstance(exc, InvalidEvaluationError):
                kind, detail = exc.kind, str(exc)
            else:
                kind, detail = EvaluationErrorKind.EVALUATOR_ERROR, f"{type(exc).__name__}: {exc}"
            event = EvaluationFailed(
                evaluation_id=evaluation_id,
                execution_id=state.execution_id,
                run_id=state.run_id,
                attempt=attempt,
                evaluator=name,
                artifact_version=state.artifact_version,
                kind=kind,
                detail=detail[:2000],
            )
        else:
            evaluated = next(a for a in facts.artifacts if a.artifact_version == result.artifact_version)
            event = EvaluationRecorded(
                evaluation_id=evaluation_id,
                execution_id=state.execution_id,
                run_id=state.run_id,
                attempt=attempt,
                evaluator=name,
                artifact_version=evaluated.artifact_version,
                branch_refs=evaluated.branch_refs,
                status=result.status,
                score=None if result.score is None else float(result.score),
                score_low=self._config.score_low,
                score_high=self._config.score_high,
                finish_reason=facts.finish,
                critique=result.critique,
                detail=result.detail[:2000],
            )
        self._log.append([NewEvent(event, idempotency_key=f"evaluation:{evaluation_id}")])
        return event, event.detail if isinstance(event, EvaluationFailed) else ""

    def _decide(self, event: RewardAssigned | PlaceholderInserted | ExecutionExcluded) -> EvaluationOutcome:
        self._log.append([new_outcome(event)])
        # Another runner may have decided first: the log's outcome is the one that stands.
        decided = self._facts(event.execution_id).outcome
        assert decided is not None  # just appended, or appended by another runner before
        return decided

    def _state(self, facts: _Facts, execution_id: str, version: str | None) -> PreservedState:
        if not facts.artifacts:
            raise InvalidEvaluationError(
                EvaluationErrorKind.UNKNOWN_ARTIFACT, f"execution {execution_id} has no preserved artifact"
            )
        chosen = facts.artifacts[-1] if version is None else None
        for artifact in facts.artifacts:
            if artifact.artifact_version == version:
                chosen = artifact
        if chosen is None:
            raise InvalidEvaluationError(
                EvaluationErrorKind.UNKNOWN_ARTIFACT,
                f"artifact version {version!r} of {execution_id} was never preserved",
            )
        return PreservedState(
            execution_id, facts.run_id, chosen.artifact_version, chosen.branch_refs, chosen.location
        )

    def _facts(self, execution_id: str) -> _Facts:
        lifecycle = self._log.read_stream(StreamId("execution", execution_id))
        dispatched = [e.event for e in lifecycle if isinstance(e.event, ExecutionDispatched)]
        if not dispatched:
            self._log.append(
                [
                    NewEvent(
                        EvaluationFailed(
                            evaluation_id=f"{execution_id}:unknown",
                            execution_id=execution_id,
                            run_id="unknown",
                            attempt=0,
                            evaluator=self._evaluator.name,
                            kind=EvaluationErrorKind.UNKNOWN_EXECUTION,
                            detail="no execution.dispatched event for this execution",
                        ),
                        idempotency_key=f"evaluation:{execution_id}:unknown",
                    )
                ]
            )
            raise UnknownExecutionError(f"{execution_id!r} was never dispatched")
        run_id = dispatched[0].run_id
        started = any(isinstance(e.event, ExecutionStarted) for e in lifecycle)
        finish = next((e.event.reason for e in lifecycle if isinstance(e.event, ExecutionFinished)), None)
        artifacts = tuple(
            e.event
            for e in self._log.read_stream(StreamId("artifact", execution_id))
            if isinstance(e.event, ArtifactPreserved)
        )
        history = self._log.read_stream(StreamId("evaluation", execution_id))
        evaluations = sum(isinstance(e.event, EvaluationRecorded | EvaluationFailed) for e in history)
        outcome = None
        for recorded in history:
            ev = recorded.event
            if isinstance(ev, RewardAssigned):
                outcome = EvaluationOutcome(
                    execution_id, RewardStatus.VALID, ev.reward, ev.evaluation_id, evaluations, "evaluated"
                )
            elif isinstance(ev, PlaceholderInserted):
                outcome = EvaluationOutcome(
                    execution_id, RewardStatus.PLACEHOLDER, 0.0, ev.evaluation_id, evaluations, ev.reason
                )
            elif isinstance(ev, ExecutionExcluded):
                outcome = EvaluationOutcome(
                    execution_id, RewardStatus.EXCLUDED, None, None, ev.attempts, ev.reason.value
                )
            if outcome is not None:
                break
        return _Facts(run_id, started, finish, artifacts, evaluations, outcome)
