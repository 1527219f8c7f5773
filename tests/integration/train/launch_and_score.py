"""One copy-line execution started by a launcher and scored by an evaluator worker, both on
threads of the test: the setup the launcher-and-evaluation integration tests share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gyre_proxy.launch import Launcher
from gyre_store import (
    Event,
    EventLog,
    ExecutionDispatched,
    ExecutionStartRequested,
    NewEvent,
    StreamId,
    TaskDefined,
    TaskSplit,
)
from gyre_train import EvaluatorWorker
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


def has_event(log: EventLog, stream: StreamId, kind: type[Event]) -> bool:
    """Whether ``stream`` holds an event of type ``kind`` yet."""
    return any(isinstance(r.event, kind) for r in log.read_stream(stream))


def run_until(
    launcher: Launcher,
    worker: EvaluatorWorker,
    done: Callable[[], bool],
    *,
    timeout_s: float,
    poll_s: float,
    join_s: float,
) -> None:
    """Run ``launcher`` and ``worker`` on threads until ``done()`` or ``timeout_s``; then stop
    both and wait up to ``join_s`` for each (it finishes what it runs on the way out)."""
    stop = threading.Event()
    threads = [threading.Thread(target=t.run, args=(stop,)) for t in (launcher, worker)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            time.sleep(poll_s)
    finally:
        stop.set()
        for thread in threads:
            thread.join(join_s)
