"""Evaluator workers on several machines share a run's evaluations through claims in Redis:
each finished execution is evaluated by one worker, and a worker that dies holding claims has
them taken over once they expire."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from gyre_store import (
    ArtifactPreserved,
    EvaluationStatus,
    EventLog,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    ExecutionStartRequested,
    FinishReason,
    InMemoryEventLog,
    InMemoryProjectionStore,
    NewEvent,
    RewardAssigned,
    TaskDefined,
    TaskSplit,
    evaluation_projections,
)
from gyre_tools.work_claims import RedisEvaluationClaims
from gyre_train import EvaluatorWorker, WorkerConfig
from gyre_train.rewards.evaluation import EvaluationResult, PreservedState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RUN = "share"


class Counting:
    """A task's evaluator that counts what it scored, by which worker; optionally slow."""

    def __init__(
        self, worker: str, seen: Counter[tuple[str, str]], lock: threading.Lock, delay_s: float = 0.0
    ):
        self.worker, self.seen, self.lock, self.delay_s = worker, seen, lock, delay_s

    @property
    def name(self) -> str:
        return "counting"

    def evaluate(self, state: PreservedState) -> EvaluationResult:
        time.sleep(self.delay_s)
        with self.lock:
            self.seen[(state.execution_id, self.worker)] += 1
        return EvaluationResult(
            score=1.0, status=EvaluationStatus.VALID, artifact_version=state.artifact_version
        )


@pytest.fixture
def shared_redis(redis_url: str) -> Iterator[str]:
    """The test Redis; the claims the test left are removed after it."""
    yield redis_url
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"gyre:{RUN}-*"):
        client.delete(key)
    client.close()


def _finish(log: EventLog, run_id: str, executions: int) -> None:
    task = TaskDefined(run_id=run_id, task_id="t0", split=TaskSplit.TRAIN, prompt="p", test_command=["true"],
                       budget_s=60, source="tasks.jsonl")  # fmt: skip
    events = [NewEvent(task)]
    for i in range(executions):
        e = f"{run_id}/e{i}"
        events += [
            NewEvent(
                ExecutionDispatched(
                    execution_id=e, run_id=run_id, group_id=f"{run_id}/g{i}", policy_version=0
                )
            ),
            NewEvent(ExecutionStartRequested(execution_id=e, run_id=run_id, task_id="t0", engine="pool")),
            NewEvent(ExecutionStarted(execution_id=e, run_id=run_id, engine="pool")),
            NewEvent(
                ArtifactPreserved(execution_id=e, run_id=run_id, artifact_version="v1", location="/nowhere")
            ),
            NewEvent(ExecutionFinished(execution_id=e, run_id=run_id, reason=FinishReason.COMPLETED)),
        ]
    log.append(events)


def _worker(
    log: EventLog, run_id: str, name: str, url: str, seen: Counter[tuple[str, str]], lock: threading.Lock,
    *, ttl_s: float = 30.0, delay_s: float = 0.0,
) -> tuple[EvaluatorWorker, RedisEvaluationClaims]:  # fmt: skip
    claims = RedisEvaluationClaims(url, run_id, name, ttl_s=ttl_s)
    worker = EvaluatorWorker(
        log, InMemoryProjectionStore(evaluation_projections().tables()), WorkerConfig(run_id=run_id, poll_s=0.01),
        evaluator_for=lambda task: Counting(name, seen, lock, delay_s), claims=claims,
    )  # fmt: skip
    return worker, claims


def _rewards(log: EventLog) -> Counter[str]:
    return Counter(r.event.execution_id for r in log.read(0) if isinstance(r.event, RewardAssigned))


def test_each_finished_execution_is_evaluated_by_one_of_the_runs_workers(shared_redis: str) -> None:
    redis_url = shared_redis
    run_id = f"{RUN}-{uuid.uuid4().hex[:8]}"
    log = InMemoryEventLog()
    seen: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()
    pairs = [_worker(log, run_id, f"w{i}", redis_url, seen, lock, delay_s=0.02) for i in range(3)]
    _finish(log, run_id, 30)
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w, _ in pairs]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(_rewards(log)) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for _, claims in pairs:
            claims.close()
    assert _rewards(log) == Counter({f"{run_id}/e{i}": 1 for i in range(30)})
    per_execution = Counter(e for e, _ in seen.elements())
    assert per_execution == Counter({f"{run_id}/e{i}": 1 for i in range(30)}), "an execution evaluated twice"
    by_worker = Counter(w for _, w in seen.elements())
    assert len(by_worker) >= 2, f"the work was not shared: {by_worker}"


def test_a_dead_workers_claims_are_taken_over_once_they_expire(shared_redis: str) -> None:
    redis_url = shared_redis
    run_id = f"{RUN}-{uuid.uuid4().hex[:8]}"
    log = InMemoryEventLog()
    seen: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()
    _finish(log, run_id, 3)
    # A worker claims every execution, then dies before evaluating any (its claims are left).
    dead = RedisEvaluationClaims(redis_url, run_id, "dead", ttl_s=1.0)
    assert all(dead.take(f"settle:{run_id}/e{i}") for i in range(3))
    dead.close()
    worker, claims = _worker(log, run_id, "alive", redis_url, seen, lock)
    try:
        worker.step()
        assert worker.waiting == 3 and worker.pending == 0  # held by another: not evaluated
        deadline = time.monotonic() + 20
        while (len(_rewards(log)) < 3 or worker.pending) and time.monotonic() < deadline:
            worker.step()
            time.sleep(0.05)
        worker.close()
    finally:
        claims.close()
    assert _rewards(log) == Counter({f"{run_id}/e{i}": 1 for i in range(3)})
    assert set(seen) == {(f"{run_id}/e{i}", "alive") for i in range(3)}
    assert worker.waiting == 0
    # Done jobs are not taken again, by this worker or another.
    other = RedisEvaluationClaims(redis_url, run_id, "late")
    try:
        assert not other.take(f"settle:{run_id}/e0")
        assert other.states([f"settle:{run_id}/e0"]) == ["done"]
    finally:
        other.close()


def test_without_claims_every_worker_evaluates_and_each_outcome_counts_once() -> None:
    log = InMemoryEventLog()
    seen: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()
    _finish(log, RUN, 2)
    workers = [
        EvaluatorWorker(
            log,
            InMemoryProjectionStore(evaluation_projections().tables()),
            WorkerConfig(run_id=RUN),
            evaluator_for=lambda task, n=n: Counting(n, seen, lock),  # type: ignore[misc]
        )
        for n in ("a", "b")
    ]
    for worker in workers:
        worker.step()
        worker.close()
    for worker in workers:
        worker.step()
    assert _rewards(log) == Counter({f"{RUN}/e0": 1, f"{RUN}/e1": 1})
