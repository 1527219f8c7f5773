"""One copy-line execution started by a launcher and scored by an evaluator worker, both on
threads of the test: the setup the launcher-and-evaluation integration tests share."""

from __future__ import annotations

import threading
import time

from gyre_proxy.launch import Launcher
from gyre_store import (
    Event,
    EventLog,
    ExecutionDispatched,
    ExecutionStartRequested,
    NewEvent,
    ProjectionStore,
    StreamId,
    TaskDefined,
    TaskSplit,
)
from gyre_train import EvaluatorWorker, WorkerConfig
from gyre_train.tasks import CHECK_COMMAND, Instance


def request_execution(
    log: EventLog, instance: Instance, *, run_id: str, execution_id: str, group_id: str, budget_s: float
) -> None:
    """Define ``instance`` as task ``t0`` of ``run_id`` and ask for one execution of it, in group
    ``group_id``, as the scheduler would."""
    task = TaskDefined(
        run_id=run_id, task_id="t0", split=TaskSplit.TRAIN, prompt=instance.prompt, files=instance.files,
        tests=instance.tests, test_command=CHECK_COMMAND, budget_s=budget_s, family="copy-line",
    )  # fmt: skip
    dispatched = ExecutionDispatched(
        execution_id=execution_id, run_id=run_id, group_id=group_id, policy_version=0
    )
    start = ExecutionStartRequested(execution_id=execution_id, run_id=run_id, task_id="t0", engine="pool")
    log.append([NewEvent(task), NewEvent(dispatched), NewEvent(start)])


def run_until(
    log: EventLog,
    launcher: Launcher,
    store: ProjectionStore,
    stream: StreamId,
    kind: type[Event],
    *,
    timeout_s: float,
    poll_s: float = 0.1,
) -> None:
    """Run ``launcher`` and an evaluator worker of its run (projecting into ``store``) on threads
    until ``stream`` holds an event of type ``kind`` or ``timeout_s`` passed; then stop both and
    wait for them (each finishes what it runs on the way out)."""
    worker = EvaluatorWorker(log, store, WorkerConfig(run_id=launcher.config.run_id))
    stop = threading.Event()
    threads = [threading.Thread(target=t.run, args=(stop,)) for t in (launcher, worker)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while (
            not any(isinstance(r.event, kind) for r in log.read_stream(stream))
            and time.monotonic() < deadline
        ):
            time.sleep(poll_s)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout_s / 2)
