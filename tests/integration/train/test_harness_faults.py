"""A harness that hangs past its budget, and one that crashes: each execution finishes with the
real reason, and its preserved work is scored by the rules for partial work."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gyre_proxy.harness import GenericHarness, Launch, LaunchSpec
from gyre_proxy.launch import Launcher, LauncherConfig
from gyre_store import (
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStartRequested,
    FinishReason,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    RewardAssigned,
    StoreConfig,
    StreamId,
    TaskDefined,
    TaskSplit,
    evaluation_projections,
)
from gyre_train import EvaluatorWorker, WorkerConfig
from gyre_train.tasks import CHECK_COMMAND, family, instances

RUN = "faulty-harness"


class ShellHarness(GenericHarness):
    """A harness that is a shell command: partial work, then a hang or a crash."""

    def __init__(self, command: str) -> None:
        self.command = command

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        return LaunchSpec(("bash", "-c", self.command))


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("echo '{first} wrong' > answer.txt; sleep 300", FinishReason.HARNESS_TIMEOUT),
        ("echo '{first} wrong' > answer.txt; kill -SEGV $$", FinishReason.FAILED),
    ],
    ids=["hangs-past-its-budget", "crashes"],
)
def test_a_faulty_harness_finishes_with_its_reason_and_its_work_is_scored(
    database_url: str, tmp_path: Path, command: str, reason: FinishReason
) -> None:
    [instance] = instances("copy-line", family("copy-line"), count=1, split=TaskSplit.TRAIN, seed=4)
    first = instance.key.split()[0]
    with PostgresEventLog(StoreConfig(database_url)) as log:
        task = TaskDefined(
            run_id=RUN, task_id="t0", split=TaskSplit.TRAIN, prompt=instance.prompt, files=instance.files,
            tests=instance.tests, test_command=CHECK_COMMAND, budget_s=2.0, family="copy-line",
        )  # fmt: skip
        log.append(
            [
                NewEvent(task),
                NewEvent(
                    ExecutionDispatched(execution_id="f-e0", run_id=RUN, group_id="f-g0", policy_version=0)
                ),
                NewEvent(
                    ExecutionStartRequested(execution_id="f-e0", run_id=RUN, task_id="t0", engine="pool")
                ),
            ]
        )
        launcher = Launcher(
            log,
            LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=tmp_path / "ws"),
            plugin=ShellHarness(command.format(first=first)),
        )
        store = PostgresProjectionStore(log.pool, evaluation_projections().tables())
        worker = EvaluatorWorker(log, store, WorkerConfig(run_id=RUN))
        stop = threading.Event()
        threads = [threading.Thread(target=t.run, args=(stop,)) for t in (launcher, worker)]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 60
            while not _rewarded(log) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        [finished] = [
            r.event
            for r in log.read_stream(StreamId("execution", "f-e0"))
            if isinstance(r.event, ExecutionFinished)
        ]
        assert finished.reason is reason, finished.detail
        [reward] = [
            r.event
            for r in log.read_stream(StreamId("evaluation", "f-e0"))
            if isinstance(r.event, RewardAssigned)
        ]
        assert reward.reward == pytest.approx(2 / 3)  # one line of two words, the first one right


def _rewarded(log: PostgresEventLog) -> bool:
    return any(isinstance(r.event, RewardAssigned) for r in log.read_stream(StreamId("evaluation", "f-e0")))
