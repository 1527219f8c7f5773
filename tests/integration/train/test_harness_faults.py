"""A harness that hangs past its budget, and one that crashes: each execution finishes with the
real reason, and its preserved work is scored by the rules for partial work."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_proxy.harness import GenericHarness, Launch, LaunchSpec
from gyre_proxy.launch import Launcher, LauncherConfig
from gyre_store import (
    ExecutionFinished,
    FinishReason,
    PostgresEventLog,
    PostgresProjectionStore,
    RewardAssigned,
    StoreConfig,
    StreamId,
    TaskSplit,
    evaluation_projections,
)
from gyre_train.tasks import family, instances
from tests.integration.train.launch_and_score import request_execution, run_until

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
        request_execution(log, instance, run_id=RUN, execution_id="f-e0", group_id="f-g0", budget_s=2.0)
        launcher = Launcher(
            log,
            LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=tmp_path / "ws"),
            plugin=ShellHarness(command.format(first=first)),
        )
        store = PostgresProjectionStore(log.pool, evaluation_projections().tables())
        run_until(log, launcher, store, StreamId("evaluation", "f-e0"), RewardAssigned, timeout_s=60)
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
