"""A harness that hangs past its budget, and one that crashes: each execution finishes with the
real reason, and its preserved work is scored by the rules for partial work."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gyre_proxy.harness import GenericHarness, Launch, LaunchSpec
from gyre_proxy.launch import ExecutionDirs, Launcher, LauncherConfig, LaunchError, Placed
from gyre_store import (
    ArtifactPreserved,
    ExecutionFinished,
    FinishReason,
    PlaceholderInserted,
    PostgresEventLog,
    PostgresProjectionStore,
    RewardAssigned,
    StoreConfig,
    StreamId,
    TaskDefined,
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


def _finished(log: PostgresEventLog, execution_id: str) -> ExecutionFinished:
    [finished] = [
        r.event
        for r in log.read_stream(StreamId("execution", execution_id))
        if isinstance(r.event, ExecutionFinished)
    ]
    return finished


def test_a_harness_that_dies_while_booting_is_started_again_within_its_budget(
    database_url: str, tmp_path: Path
) -> None:
    [instance] = instances("copy-line", family("copy-line"), count=1, split=TaskSplit.TRAIN, seed=4)
    marker, starts = tmp_path / "booted-once", tmp_path / "starts"
    command = (
        f"echo start >> {starts}; test -f {marker} || {{ touch {marker}; exit 7; }}; echo done > answer.txt"
    )
    with PostgresEventLog(StoreConfig(database_url)) as log:
        request_execution(log, instance, run_id=RUN, execution_id="f-b0", group_id="f-g1", budget_s=30.0)
        launcher = Launcher(
            log,
            LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=tmp_path / "ws"),
            plugin=ShellHarness(command),
        )
        store = PostgresProjectionStore(log.pool, evaluation_projections().tables())
        run_until(log, launcher, store, StreamId("evaluation", "f-b0"), RewardAssigned, timeout_s=60)
        finished = _finished(log, "f-b0")
        assert finished.reason is FinishReason.COMPLETED, finished.detail
        assert starts.read_text().split() == ["start", "start"]
        log_text = (tmp_path / "ws" / "f-b0" / "harness.log").read_text()
        assert "harness exited 7 while booting: started again" in log_text


def test_a_harness_that_keeps_dying_while_booting_fails_after_its_retries(
    database_url: str, tmp_path: Path
) -> None:
    [instance] = instances("copy-line", family("copy-line"), count=1, split=TaskSplit.TRAIN, seed=4)
    starts = tmp_path / "starts"
    with PostgresEventLog(StoreConfig(database_url)) as log:
        request_execution(log, instance, run_id=RUN, execution_id="f-b1", group_id="f-g2", budget_s=30.0)
        launcher = Launcher(
            log,
            LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=tmp_path / "ws", boot_retries=2),
            plugin=ShellHarness(f"echo start >> {starts}; exit 9"),
        )
        store = PostgresProjectionStore(log.pool, evaluation_projections().tables())
        run_until(log, launcher, store, StreamId("evaluation", "f-b1"), RewardAssigned, timeout_s=60)
        finished = _finished(log, "f-b1")
        assert finished.reason is FinishReason.FAILED and "harness exited 9" in finished.detail
        assert len(starts.read_text().split()) == 3  # the start and two starts again


class BrokenSandbox:
    """A placement whose sandbox cannot boot (an image that cannot be built, say)."""

    sandboxed = True

    def write_workspace(self, task: TaskDefined, workspace: Path) -> None:
        raise AssertionError("a built-in task's files are in its event")

    def inside(self, task: TaskDefined, dirs: ExecutionDirs) -> tuple[Path, Path]:
        return Path("/app"), Path("/home/agent")

    def place(self, spec: LaunchSpec, task: TaskDefined, dirs: ExecutionDirs, name: str) -> Placed:
        raise LaunchError("sandbox podman: image localhost/missing cannot be built")


def test_an_environment_that_cannot_boot_is_a_total_failure_with_a_placeholder_reward(
    database_url: str, tmp_path: Path
) -> None:
    [instance] = instances("copy-line", family("copy-line"), count=1, split=TaskSplit.TRAIN, seed=4)
    with PostgresEventLog(StoreConfig(database_url)) as log:
        request_execution(log, instance, run_id=RUN, execution_id="f-s0", group_id="f-g3", budget_s=30.0)
        launcher = Launcher(
            log,
            LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=tmp_path / "ws"),
            plugin=ShellHarness("echo never > answer.txt"),
            placement=BrokenSandbox(),
        )
        store = PostgresProjectionStore(log.pool, evaluation_projections().tables())
        run_until(log, launcher, store, StreamId("evaluation", "f-s0"), PlaceholderInserted, timeout_s=60)
        finished = _finished(log, "f-s0")
        assert finished.reason is FinishReason.FAILED and "cannot be built" in finished.detail
        assert not any(
            isinstance(r.event, ArtifactPreserved) for r in log.read_stream(StreamId("execution", "f-s0"))
        )
        [placeholder] = [
            r.event
            for r in log.read_stream(StreamId("evaluation", "f-s0"))
            if isinstance(r.event, PlaceholderInserted)
        ]
        assert placeholder.reason == "no preserved artifact"  # the paper's total failure: a zero in its group
        assert not (tmp_path / "ws" / "f-s0" / "workspace").exists()


def test_boots_are_capped_in_concurrency(database_url: str, tmp_path: Path) -> None:
    [instance] = instances("copy-line", family("copy-line"), count=1, split=TaskSplit.TRAIN, seed=4)
    with PostgresEventLog(StoreConfig(database_url)) as log:
        for i in range(3):
            request_execution(
                log, instance, run_id=RUN, execution_id=f"f-c{i}", group_id=f"f-gc{i}", budget_s=30.0
            )
        launcher = Launcher(
            log,
            LauncherConfig(
                run_id=RUN,
                proxy_url="http://127.0.0.1:9",
                root=tmp_path / "ws",
                max_booting=2,
                boot_window_s=60.0,
            ),
            plugin=ShellHarness("sleep 20"),
        )
        try:
            launcher.step()
            assert launcher.running == 2 and launcher.booting == 2  # the third waits for a boot to end
            launcher.step()
            assert launcher.running == 2
        finally:
            launcher.run(_stopped())


def _stopped() -> threading.Event:
    stop = threading.Event()
    stop.set()
    return stop
