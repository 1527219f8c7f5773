"""The evaluation runner on the in-memory log: partial scoring, retries, budget, placeholders, bad input."""

from __future__ import annotations

import pytest

from gyre_store import (
    EvaluationErrorKind,
    EvaluationRecorded,
    EvaluationStatus,
    FinishReason,
    InMemoryEventLog,
    InMemoryProjectionStore,
    NewEvent,
    RewardAssigned,
    StreamId,
    new_outcome,
)
from gyre_train import (
    CallableEvaluator,
    EvaluationConfig,
    EvaluationResult,
    EvaluationRunner,
    ExecutionNotClosedError,
    InvalidConfigError,
    InvalidEvaluationError,
    PreservedState,
    RewardStatus,
    UnknownExecutionError,
)
from tests.unit.train.runs import catch_all, dispatch_group, finish, memory_store, start

RUN = "run-eval"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def _closed(log: InMemoryEventLog, ids: list[str], reason: FinishReason = FinishReason.COMPLETED) -> None:
    dispatch_group(log, RUN, "g0", ids)
    for e in ids:
        start(log, e, RUN)
        finish(log, e, RUN, reason)


def _runner(log: InMemoryEventLog, fn, clock: FakeClock | None = None, **config: object) -> EvaluationRunner:  # type: ignore[no-untyped-def]
    return EvaluationRunner(log, CallableEvaluator(fn), EvaluationConfig(**config), clock or FakeClock())  # type: ignore[arg-type]


def _rows(log: InMemoryEventLog) -> InMemoryProjectionStore:
    store = memory_store(log)
    catch_all(log, store)
    return store


def test_partial_scoring_after_a_timeout_gives_the_same_reward_as_completion() -> None:
    log = InMemoryEventLog()
    dispatch_group(log, RUN, "g0", ["done", "timed-out"])
    for e, reason in (("done", FinishReason.COMPLETED), ("timed-out", FinishReason.HARNESS_TIMEOUT)):
        start(log, e, RUN)
        finish(log, e, RUN, reason)
    seen: list[PreservedState] = []

    def score(state: PreservedState) -> float:
        seen.append(state)
        return 0.4  # the evaluator sees only the preserved state, never time, length or status

    runner = _runner(log, score)
    for e in ("done", "timed-out"):
        runner.preserve(e, "v1", branch_refs=["refs/heads/main"], location=f"/ws/{e}")
    outcomes = [runner.settle(e, deadline=100.0) for e in ("done", "timed-out")]
    assert [o.reward for o in outcomes] == [0.4, 0.4]
    assert all(o.status is RewardStatus.VALID for o in outcomes)
    assert seen[1] == PreservedState("timed-out", RUN, "v1", ("refs/heads/main",), "/ws/timed-out")

    store = _rows(log)
    [evaluation] = store.select("gyre_evaluations", "execution_id", "timed-out")
    assert evaluation["finish_reason"] == "harness_timeout" and evaluation["status"] == "valid"
    [reward] = store.select("gyre_rewards", "execution_id", "timed-out")
    assert reward["evaluation_id"] == evaluation["evaluation_id"]
    assert (reward["artifact_version"], reward["branch_refs"]) == ("v1", ["refs/heads/main"])


def test_a_failing_evaluator_is_retried_on_the_same_state_then_the_execution_is_excluded() -> None:
    log = InMemoryEventLog()
    _closed(log, ["e0", "e1"])
    seen: list[PreservedState] = []
    answers = iter([RuntimeError("flaky"), 0.0])

    def flaky(state: PreservedState) -> float:
        seen.append(state)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = FakeClock()
    runner = _runner(log, flaky, clock, retry_delay_s=10.0, max_attempts=None)
    runner.preserve("e0", "v1", location="/ws/e0")
    outcome = runner.settle("e0", deadline=100.0)
    assert seen[0] == seen[1] and clock.sleeps == [10.0]
    # A valid zero is a reward, and the failed attempt before it stays on record.
    assert (outcome.status, outcome.reward) == (RewardStatus.VALID, 0.0)

    def broken(state: PreservedState) -> float:
        raise OSError("sandbox unreachable")

    clock = FakeClock()
    runner = _runner(log, broken, clock, retry_delay_s=30.0, max_attempts=None)
    runner.preserve("e1", "v1")
    excluded = runner.settle("e1", deadline=100.0)
    assert excluded.status is RewardStatus.EXCLUDED and excluded.reward is None
    assert excluded.attempts == 4 and excluded.reason == "budget_exhausted"
    assert clock.t == 100.0  # the last pause stops at the deadline

    store = _rows(log)
    e0 = store.select("gyre_evaluations", "execution_id", "e0")
    assert [(r["status"], r["error_kind"]) for r in e0] == [("failed", "evaluator_error"), ("valid", None)]
    [r1] = store.select("gyre_rewards", "execution_id", "e1")
    assert r1["status"] == "excluded" and r1["reward"] is None and "sandbox unreachable" in r1["error"]


def test_attempt_cap_and_an_overall_timeout_with_no_budget_left() -> None:
    log = InMemoryEventLog()
    _closed(log, ["e0", "e1"], FinishReason.OVERALL_TIMEOUT)

    def broken(state: PreservedState) -> float:
        raise ValueError("no")

    runner = _runner(log, broken, max_attempts=2, retry_delay_s=0.0)
    runner.preserve("e0", "v1")
    runner.preserve("e1", "v1")
    capped = runner.settle("e0", deadline=10.0)
    assert (capped.status, capped.attempts, capped.reason) == (RewardStatus.EXCLUDED, 2, "attempts_exhausted")
    spent = runner.settle("e1", deadline=0.0)
    assert (spent.attempts, spent.reason) == (0, "budget_exhausted")


def test_nothing_evaluable_inserts_a_zero_placeholder() -> None:
    log = InMemoryEventLog()
    dispatch_group(log, RUN, "g0", ["never", "empty", "fine"])
    finish(log, "never", RUN, FinishReason.FAILED)  # the environment never started
    for e in ("empty", "fine"):
        start(log, e, RUN)
        finish(log, e, RUN)

    def judge(state: PreservedState) -> EvaluationResult:
        if state.execution_id == "empty":
            return EvaluationResult(None, EvaluationStatus.NOT_EVALUABLE, state.artifact_version)
        return EvaluationResult(1.0, EvaluationStatus.VALID, state.artifact_version)

    runner = _runner(log, judge)
    runner.preserve("empty", "v1")
    runner.preserve("fine", "v1")
    never = runner.settle("never", deadline=10.0)
    assert (never.status, never.reward, never.reason) == (
        RewardStatus.PLACEHOLDER,
        0.0,
        "environment never started",
    )
    empty = runner.settle("empty", deadline=10.0)
    assert empty.status is RewardStatus.PLACEHOLDER and empty.evaluation_id == "empty:1"
    assert runner.settle("fine", deadline=10.0).reward == 1.0
    store = _rows(log)
    assert [r["status"] for r in store.dump("gyre_rewards")] == ["placeholder", "valid", "placeholder"]
    [group] = store.dump("gyre_groups")
    assert (group["status"], group["placeholders"], group["valid"]) == ("ready", 2, 1)


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ("0.5", EvaluationErrorKind.MALFORMED_RESULT),
        (EvaluationResult(float("nan"), EvaluationStatus.VALID, "v1"), EvaluationErrorKind.MALFORMED_RESULT),
        (EvaluationResult(0.5, EvaluationStatus.NOT_EVALUABLE, "v1"), EvaluationErrorKind.MALFORMED_RESULT),
        (1.5, EvaluationErrorKind.SCORE_OUT_OF_RANGE),
        (-0.1, EvaluationErrorKind.SCORE_OUT_OF_RANGE),
        (EvaluationResult(0.5, EvaluationStatus.VALID, "v9"), EvaluationErrorKind.UNKNOWN_ARTIFACT),
    ],
)
def test_bad_results_are_recorded_as_errors_and_nothing_valid_is_lost(
    answer: object, kind: EvaluationErrorKind
) -> None:
    log = InMemoryEventLog()
    _closed(log, ["e0"])
    answers = iter([0.25, answer])
    runner = _runner(log, lambda state: next(answers))
    runner.preserve("e0", "v1")
    first = runner.evaluate("e0")  # an intermediate evaluation of v1
    with pytest.raises(InvalidEvaluationError, match=kind.value):
        runner.evaluate("e0")
    store = _rows(log)
    rows = store.select("gyre_evaluations", "execution_id", "e0")
    assert [(r["status"], r["score"]) for r in rows] == [("valid", 0.25), ("failed", None)]
    assert rows[0]["evaluation_id"] == first.evaluation_id and rows[1]["error_kind"] == kind.value
    assert store.dump("gyre_rewards") == []  # an error is never a reward


def test_later_evaluations_never_overwrite_earlier_ones_and_the_outcome_is_decided_once() -> None:
    log = InMemoryEventLog()
    _closed(log, ["e0"])
    scores = iter([0.2, 0.6, 0.9])
    runner = _runner(log, lambda state: next(scores))
    runner.preserve("e0", "v1", branch_refs=["refs/heads/wip"])
    runner.evaluate("e0")
    runner.preserve("e0", "v2", branch_refs=["refs/heads/main"])
    runner.evaluate("e0", "v1")
    outcome = runner.settle("e0", deadline=10.0)
    assert outcome.reward == 0.9 and outcome.evaluation_id == "e0:3"
    assert runner.settle("e0", deadline=10.0) == outcome  # already decided: no new evaluation
    [again] = log.append([new_outcome(RewardAssigned(
        execution_id="e0", run_id=RUN, evaluation_id="e0:1", reward=0.2, artifact_version="v1"))])  # fmt: skip
    assert again.duplicate
    store = _rows(log)
    rows = store.select("gyre_evaluations", "execution_id", "e0")
    assert [(r["artifact_version"], r["score"], r["branch_refs"]) for r in rows] == [
        ("v1", 0.2, ["refs/heads/wip"]),
        ("v1", 0.6, ["refs/heads/wip"]),
        ("v2", 0.9, ["refs/heads/main"]),
    ]
    [reward] = store.dump("gyre_rewards")
    assert (reward["reward"], reward["evaluation_id"], reward["artifact_version"]) == (0.9, "e0:3", "v2")


def test_unknown_and_open_executions_are_clear_errors() -> None:
    log = InMemoryEventLog()
    dispatch_group(log, RUN, "g0", ["running"])
    start(log, "running", RUN)
    runner = _runner(log, lambda state: 1.0)
    with pytest.raises(UnknownExecutionError, match="ghost"):
        runner.settle("ghost", deadline=10.0)
    with pytest.raises(UnknownExecutionError):
        runner.preserve("ghost", "v1")
    [recorded] = log.read_stream(StreamId("evaluation", "ghost"))
    assert recorded.event.kind == EvaluationErrorKind.UNKNOWN_EXECUTION  # type: ignore[attr-defined]
    with pytest.raises(ExecutionNotClosedError):
        runner.settle("running", deadline=10.0)
    finish(log, "running", RUN, FinishReason.SURPLUS)
    with pytest.raises(InvalidEvaluationError, match="surplus"):
        runner.settle("running", deadline=10.0)
    with pytest.raises(InvalidConfigError):
        EvaluationConfig(score_low=1.0, score_high=0.0)


def test_evaluations_written_past_the_runner_are_rejected_by_the_projection() -> None:
    log = InMemoryEventLog()
    _closed(log, ["e0"])
    bogus = EvaluationRecorded(
        evaluation_id="x1", execution_id="e0", run_id=RUN, attempt=1, evaluator="hand",
        artifact_version="never-preserved", status=EvaluationStatus.VALID, score=0.5,
    )  # fmt: skip
    out_of_range = EvaluationRecorded(
        evaluation_id="x2", execution_id="e0", run_id=RUN, attempt=2, evaluator="hand",
        artifact_version="v1", status=EvaluationStatus.VALID, score=7.0,
    )  # fmt: skip
    _runner(log, lambda s: 1.0).preserve("e0", "v1")
    reused = EvaluationRecorded(
        evaluation_id="x1", execution_id="e0", run_id=RUN, attempt=3, evaluator="hand",
        artifact_version="v1", status=EvaluationStatus.VALID, score=1.0,
    )  # fmt: skip
    log.append([NewEvent(bogus), NewEvent(out_of_range), NewEvent(reused)])
    log.append([new_outcome(RewardAssigned(
        execution_id="e0", run_id=RUN, evaluation_id="x1", reward=0.5, artifact_version="never-preserved"))])  # fmt: skip
    store = _rows(log)
    assert [(r["status"], r["error_kind"]) for r in store.dump("gyre_evaluations")] == [
        ("rejected", "unknown_artifact"),
        ("rejected", "score_out_of_range"),
    ]
    [reward] = store.dump("gyre_rewards")
    assert reward["status"] == "rejected" and "rejected evaluation" in reward["error"]
    [group] = store.dump("gyre_groups")
    assert group["status"] == "ready"  # counted by the group, refused when it is built (test_groups)
