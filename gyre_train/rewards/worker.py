"""The evaluator worker: scores a run's finished executions and announces ready groups.

It follows a run's log. When an execution finishes, it evaluates the execution's preserved
workspace with the evaluator ``evaluator_for`` makes for its task (in ``gyre run``: its tests in
the run's sandbox, or its judge), else with ``CommandEvaluator`` on this host (a built-in
family's task: the ``test_command`` and hidden test files of ``task.defined``), through the
``EvaluationRunner``, which applies the rules for
partial work, pending evaluations, retries, exclusion and placeholders. After each outcome it
folds the groups projection and appends ``group.ready`` for every group that became ready:
the group projection decides readiness, this worker is the component that writes the fact.

Several workers may serve one run: outcomes and group announcements are idempotent per
execution and per group, and each settles executions in its own threads. With ``claims``
(claims.py: Redis, shared by the run's workers on every machine) each finished execution is
settled by the one worker that claimed it; the others wait, and take it over if that worker's
claim expires. Without, every worker settles every execution (each outcome still counts once).
An intermediate evaluation an execution asks for is made by every worker that sees the ask.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from gyre_store import (
    EvaluationRequested,
    EventLog,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStartRequested,
    GroupReady,
    GroupStatus,
    NewEvent,
    ProjectionStore,
    TaskDefined,
    catch_up,
    evaluation_projections,
)
from gyre_store.log import Event, EventMetadata, RunFollower, base_run
from gyre_train.exceptions import GyreTrainError, InvalidConfigError
from gyre_train.rewards.claims import CLAIM_DONE, EvaluationClaims
from gyre_train.rewards.evaluation import (
    EvaluationConfig,
    EvaluationOutcome,
    EvaluationResult,
    EvaluationRunner,
    Evaluator,
    PreservedState,
)
from gyre_train.rewards.evaluators import CommandEvaluator
from gyre_train.rewards.judge_engines import is_judge_run

FOLLOWED = (
    "task.defined",
    "execution.dispatched",
    "execution.start_requested",
    "execution.finished",
    "evaluation.requested",
)
PYTHON = "{python}"  # placeholder in a task's test command for this interpreter


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Which run to serve, how many evaluations at once, and the evaluation rules."""

    run_id: str
    threads: int = 2
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    settle_window_s: float = 120.0  # how long a failing evaluation is retried before exclusion
    poll_s: float = 0.2

    def __post_init__(self) -> None:
        if self.threads < 1 or self.settle_window_s <= 0:
            raise InvalidConfigError("threads must be >= 1 and settle_window_s positive")


class EvaluatorWorker:
    """Follows one run; ``step()`` handles what is new, ``run(stop)`` loops until stopped."""

    def __init__(
        self,
        log: EventLog,
        store: ProjectionStore,
        config: WorkerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        evaluator_for: Callable[[TaskDefined], Evaluator | None] | None = None,
        claims: EvaluationClaims | None = None,
    ) -> None:
        self.log = log
        self._claims = claims
        self._waiting: set[str] = set()  # finished executions another worker has claimed
        self._evaluator_for = evaluator_for
        self.store = store
        self.config = config
        self._clock = clock
        self._tasks: dict[tuple[str, str], TaskDefined] = {}
        self._task_of: dict[str, tuple[str, str]] = {}
        self._grouped: set[str] = set()  # executions dispatched into a rollout group
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix="gyre-evaluate")
        self._inflight: dict[str, Future[EvaluationOutcome]] = {}
        self._announced: set[str] = set()
        self._asked: list[Future[None]] = []  # intermediate evaluations executions asked for
        # The run's events and its side runs' (held-out evaluations, say).
        self._follower = RunFollower(log, config.run_id, FOLLOWED, self._note)
        self.settled = 0

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)

    # -- following ---------------------------------------------------------------------------

    def step(self) -> int:
        """Read new events, start evaluations of newly finished executions, collect finished
        evaluations and announce ready groups; returns how many outcomes were collected."""
        self._follower.read_new()
        for asked in [f for f in self._asked if f.done()]:
            self._asked.remove(asked)
            asked.result()
        done = [e for e, f in self._inflight.items() if f.done()]
        for execution_id in done:
            self._inflight.pop(execution_id).result()  # re-raises what the runner could not record
            if self._claims is not None:
                self._claims.done(_job(execution_id))
        if self._claims is not None:
            self._claims.renew([_job(e) for e in self._inflight])
            self._take_over()
        if done and self._grouped:
            self._announce_ready_groups()
        self.settled += len(done)
        return len(done)

    def run(self, stop: threading.Event) -> None:
        try:
            self._follower.run(stop, self.step, self.config.poll_s)
        finally:
            self.close()

    @property
    def pending(self) -> int:
        return len(self._inflight)

    def _note(self, event: Event, run_id: str) -> None:
        match event:
            case TaskDefined(task_id=task_id):
                self._tasks[(run_id, task_id)] = event
            case ExecutionStartRequested(execution_id=execution_id, task_id=task_id):
                self._task_of[execution_id] = (base_run(run_id), task_id)  # a side run's tasks are its run's
            case ExecutionDispatched(execution_id=execution_id):
                if run_id == self.config.run_id:
                    self._grouped.add(execution_id)
            case ExecutionFinished(execution_id=execution_id):
                if is_judge_run(run_id):
                    return  # a judge's call on the run's engines (judge_engines): nothing to evaluate
                if execution_id not in self._inflight and execution_id not in self._waiting:
                    self._start(execution_id)
            case EvaluationRequested(execution_id=execution_id, artifact_version=version):
                self._asked.append(self._pool.submit(self._evaluate_asked, execution_id, version))

    @property
    def waiting(self) -> int:
        """Finished executions another worker has claimed, which this one may take over."""
        return len(self._waiting)

    def _start(self, execution_id: str) -> None:
        if self._claims is not None and not self._claims.take(_job(execution_id)):
            self._waiting.add(execution_id)
            return
        self._inflight[execution_id] = self._pool.submit(self._settle, execution_id)

    def _take_over(self) -> None:
        """Drop the waiting executions another worker has settled; claim those whose taker's
        claim expired."""
        assert self._claims is not None
        waiting = sorted(self._waiting)
        for execution_id, state in zip(waiting, self._claims.states([_job(e) for e in waiting]), strict=True):
            if state == CLAIM_DONE:
                self._waiting.discard(execution_id)
            elif state is None:
                self._waiting.discard(execution_id)
                self._start(execution_id)
            # else: held by its taker, or CLAIM_UNKNOWN (the claims did not answer): wait

    # -- one execution -----------------------------------------------------------------------

    def _evaluator(self, execution_id: str) -> Evaluator:
        key = self._task_of.get(execution_id)
        task = self._tasks.get(key) if key is not None else None
        if task is None or not task.test_command:
            # The runner records this as a failed evaluation; the execution is then excluded.
            raise InvalidConfigError(f"execution {execution_id} has no task with a test command")
        if self._evaluator_for is not None and (made := self._evaluator_for(task)) is not None:
            return made
        if task.source:
            raise InvalidConfigError(
                f"task {task.task_id} is read from {task.source}: this worker has no evaluator for it"
            )
        command = [part.replace(PYTHON, sys.executable) for part in task.test_command]
        return CommandEvaluator(command, tests=task.tests, name=f"tests:{task.family or task.task_id}")

    def _evaluate_asked(self, execution_id: str, version: str) -> None:
        """An intermediate evaluation a running execution asked for: recorded, deciding nothing
        (a failure is recorded too, and the execution's ask is answered with it)."""
        runner = EvaluationRunner(self.log, _Deferred(self, execution_id), self.config.evaluation)
        with contextlib.suppress(GyreTrainError):
            runner.evaluate(execution_id, version)

    def _settle(self, execution_id: str) -> EvaluationOutcome:
        runner = EvaluationRunner(self.log, _Deferred(self, execution_id), self.config.evaluation)
        return runner.settle(execution_id, deadline=self._clock() + self.config.settle_window_s)

    # -- groups ------------------------------------------------------------------------------

    def _announce_ready_groups(self) -> None:
        head = self.log.head()
        for projection in evaluation_projections():
            catch_up(self.log, self.store, projection, until=head)
        events: list[NewEvent] = []
        for row in self.store.select("gyre_groups", "status", GroupStatus.READY):
            group_id, run_id = str(row["group_id"]), str(row["run_id"])
            if group_id in self._announced or run_id != self.config.run_id:
                continue
            self._announced.add(group_id)
            ready = GroupReady(group_id=group_id, run_id=run_id)
            events.append(NewEvent(ready, f"group.ready:{group_id}", metadata=EventMetadata(run_id=run_id)))
        if events:
            self.log.append(events)


def _job(execution_id: str) -> str:
    return f"settle:{execution_id}"


class _Deferred:
    """The evaluator of one execution, built when the runner first asks (its task may be
    defined after the worker saw the execution finish)."""

    def __init__(self, worker: EvaluatorWorker, execution_id: str) -> None:
        self._worker, self._execution_id = worker, execution_id
        self._built: Evaluator | None = None

    def _build(self) -> Evaluator:
        if self._built is None:
            self._built = self._worker._evaluator(self._execution_id)
        return self._built

    @property
    def name(self) -> str:
        """The built evaluator's name (``tests:<kind>`` for a sourced task), else ``tests``."""
        try:
            return self._build().name
        except GyreTrainError:  # recorded by the runner when it evaluates
            return "tests"

    def evaluate(self, state: PreservedState) -> EvaluationResult:
        return self._build().evaluate(state)
