"""Two launchers follow one run, as one per host would, each with its own name and its own
number of harnesses at once: every execution starts exactly once (one harness process, one
``execution.started``), each launcher stays within its own limit, both take work, and a
launcher started again finishes only the executions its own name started, while the executions
of a launcher lost with its host (no heartbeat in Redis) are finished by another."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from gyre_proxy.harness import GenericHarness, Launch, LaunchSpec
from gyre_proxy.launch import Launcher, LauncherConfig, RedisLiveness
from gyre_store import (
    ArtifactPreserved,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    ExecutionStartRequested,
    NewEvent,
    PostgresEventLog,
    StoreConfig,
    TaskDefined,
    TaskSplit,
)
from gyre_train.tasks import CHECK_COMMAND, family, instances

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RUN = "two-launchers"
EXECUTIONS = 10


class Marked(GenericHarness):
    """Notes, in a file beside the workspaces, when it started and ended and under whom."""

    def __init__(self, host: str, trace: Path) -> None:
        self.host, self.trace = host, trace

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        line = f"{self.host} $(basename $(dirname $PWD))"
        return LaunchSpec(("bash", "-c", f'echo "start {line} $(date +%s.%N)" >> {self.trace}; sleep 0.6; '
                                         f'echo "end {line} $(date +%s.%N)" >> {self.trace}'))  # fmt: skip


def _request_all(log: PostgresEventLog, *, run_id: str = RUN, count: int = EXECUTIONS) -> list[str]:
    [instance] = instances("copy-line", family("copy-line"), count=1, split=TaskSplit.TRAIN, seed=4)
    task = TaskDefined(
        run_id=run_id, task_id="t0", split=TaskSplit.TRAIN, prompt=instance.prompt, files=instance.files,
        tests=instance.tests, test_command=CHECK_COMMAND, budget_s=60, family="copy-line",
    )  # fmt: skip
    ids = [f"{run_id}-e{i}" for i in range(count)]
    events = [NewEvent(task)]
    for i, execution_id in enumerate(ids):
        events += [
            NewEvent(ExecutionDispatched(execution_id=execution_id, run_id=run_id, group_id=f"g{i // 2}",
                                         policy_version=0)),
            NewEvent(ExecutionStartRequested(execution_id=execution_id, run_id=run_id, task_id="t0", engine="pool")),
        ]  # fmt: skip
    log.append(events)
    return ids


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_each_execution_starts_once_within_each_launchers_own_limit(
    database_url: str, tmp_path: Path
) -> None:
    trace, root = tmp_path / "trace", tmp_path / "workspaces"  # one folder, as hosts share run_dir
    limits = {"host-a": 2, "host-b": 3}
    with PostgresEventLog(StoreConfig(database_url)) as setup:
        ids = _request_all(setup)
    stop = threading.Event()
    with contextlib.ExitStack() as hosts:
        logs = [hosts.enter_context(PostgresEventLog(StoreConfig(database_url))) for _ in limits]  # one each
        launchers = [
            Launcher(log, LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=root, name=name,
                                         max_running=limit, fork_entries=False), plugin=Marked(name, trace))
            for log, (name, limit) in zip(logs, limits.items(), strict=True)
        ]  # fmt: skip
        threads = [threading.Thread(target=launcher.run, args=(stop,)) for launcher in launchers]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 120
            while True:
                finished = [r.event for r in logs[0].read() if isinstance(r.event, ExecutionFinished)]
                if len(finished) >= EXECUTIONS or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        events = [r.event for r in logs[0].read()]
        started = [e for e in events if isinstance(e, ExecutionStarted)]
        assert sorted(e.execution_id for e in started) == sorted(ids)  # each once
        assert sorted(e.execution_id for e in events if isinstance(e, ExecutionFinished)) == sorted(ids)
        assert all(e.reason.value == "completed" for e in events if isinstance(e, ExecutionFinished))
        # One harness process per execution, run by the launcher that recorded its start.
        lines = [line.split() for line in trace.read_text().splitlines()]
        runs = Counter((host, execution) for kind, host, execution, _ in lines if kind == "start")
        assert sorted(runs) == sorted((e.launcher, e.execution_id) for e in started)
        assert set(runs.values()) == {1}
        by_host = Counter(e.launcher for e in started)
        assert set(by_host) == set(limits), by_host  # both took work
        for host, limit in limits.items():
            times: dict[str, dict[str, float]] = {}
            for kind, who, execution, at in lines:
                if who == host:
                    times.setdefault(execution, {})[kind] = float(at)
            assert 1 <= _most_at_once([(t["start"], t["end"]) for t in times.values()]) <= limit, host

        # A launcher started again recovers its own: host-b's new life finishes nothing of host-a's.
        with PostgresEventLog(StoreConfig(database_url)) as log:
            extra = ExecutionStartRequested(execution_id="late", run_id=RUN, task_id="t0", engine="pool")
            log.append([NewEvent(extra)])
            log.append(
                [
                    NewEvent(
                        ExecutionStarted(execution_id="late", run_id=RUN, engine="pool", launcher="host-a")
                    )
                ]
            )
            Launcher(
                log, LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=root, name="host-b")
            )
            assert not [
                r
                for r in log.read()
                if isinstance(r.event, ExecutionFinished) and r.event.execution_id == "late"
            ]
            Launcher(
                log, LauncherConfig(run_id=RUN, proxy_url="http://127.0.0.1:9", root=root, name="host-a")
            )
            [lost] = [
                r.event
                for r in log.read()
                if isinstance(r.event, ExecutionFinished) and r.event.execution_id == "late"
            ]
            assert lost.reason.value == "failed" and "restarted" in lost.detail


class Shell(GenericHarness):
    def __init__(self, command: str) -> None:
        self.command = command

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        return LaunchSpec(("bash", "-c", self.command))


def test_the_executions_of_a_lost_launcher_are_finished_by_another(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    run = f"{RUN}-lost-{os.getpid()}"
    root = tmp_path / "workspaces"
    with PostgresEventLog(StoreConfig(database_url)) as log:
        ids = _request_all(log, run_id=run, count=4)

        def launcher(name: str, command: str) -> Launcher:
            config = LauncherConfig(run_id=run, proxy_url="http://127.0.0.1:9", root=root, name=name,
                                    max_running=2, fork_entries=False)  # fmt: skip
            return Launcher(log, config, plugin=Shell(command),
                            liveness=RedisLiveness(redis_url, run, name, ttl_s=1.5))  # fmt: skip

        doomed = launcher("host-b", "echo partial > answer.txt; sleep 300")
        doomed.step()  # takes two, then its host is lost: it never steps again
        lost = sorted(doomed._running)
        assert len(lost) == 2
        survivor = launcher("host-a", "true")
        stop = threading.Event()
        thread = threading.Thread(target=survivor.run, args=(stop,))
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while len(finished := _finished(log, run)) < len(ids) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            thread.join(30)
            for running in doomed._running.values():  # the lost host's harnesses, ended (and reaped)
                doomed._kill(running)
        assert sorted(finished) == sorted(ids)
        for execution_id in lost:
            assert finished[execution_id].reason.value == "failed"
            assert "launcher host-b was lost" in finished[execution_id].detail
        assert {finished[e].reason.value for e in set(ids) - set(lost)} == {"completed"}
        # The lost launcher's work is preserved, for scoring as partial work.
        preserved = {r.event.execution_id for r in log.read() if isinstance(r.event, ArtifactPreserved)}
        assert set(lost) <= preserved


def _finished(log: PostgresEventLog, run_id: str) -> dict[str, ExecutionFinished]:
    return {
        r.event.execution_id: r.event
        for r in log.read()
        if isinstance(r.event, ExecutionFinished) and r.event.run_id == run_id
    }
