"""Workloads built from a run's stored execution events."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from gyre_sched import Outcome, WorkloadError, simulate, workload_from_run
from gyre_store import (
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    InMemoryEventLog,
    NewEvent,
    RecordedEvent,
)
from tests.unit.sched.helpers import small_cluster, tiny

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class TimedLog(InMemoryEventLog):
    """An in-memory log whose events are recorded at the times the test chose."""

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[int, datetime] = {}

    def at(self, seconds: float, *events: NewEvent) -> None:
        for result in self.append(list(events)):
            self.times[result.position] = T0 + timedelta(seconds=seconds)

    def read(
        self,
        after: int = 0,
        *,
        limit: int = 1000,
        until: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        events = super().read(after, limit=limit, until=until, types=types)
        return [dataclasses.replace(e, recorded_at=self.times.get(e.position, e.recorded_at)) for e in events]


def execution(log: TimedLog, run: str, ident: str, group: str | None, start: float | None, end: float | None,
              reason: FinishReason = FinishReason.COMPLETED) -> None:  # fmt: skip
    if group is not None:
        log.at(
            0.0,
            NewEvent(ExecutionDispatched(execution_id=ident, run_id=run, group_id=group, policy_version=0)),
        )
    if start is not None:
        log.at(start, NewEvent(ExecutionStarted(execution_id=ident, run_id=run, engine="cell-0")))
    if end is not None:
        log.at(end, NewEvent(ExecutionFinished(execution_id=ident, run_id=run, reason=reason)))


def test_durations_and_outcomes_come_from_the_stored_events() -> None:
    log = TimedLog()
    execution(log, "r", "r/e0", "r/g0", 10.0, 3610.0)
    execution(log, "r", "r/e1", "r/g0", 20.0, 14420.0, FinishReason.HARNESS_TIMEOUT)
    execution(log, "r", "r/e2", "r/g1", 30.0, 130.0, FinishReason.OVERALL_TIMEOUT)
    execution(log, "r", "r/e3", "r/g1", 40.0, None)  # still running: left out
    execution(log, "r", "r/e4", "r/g1", None, 50.0, FinishReason.CANCELLED)  # never started: left out
    execution(log, "other", "o/e0", "o/g0", 0.0, 99999.0)  # another run
    model = workload_from_run(log, "r")
    assert model.by_query and model.name == "run:r"
    assert [g.durations_s for g in model.groups] == [(3600.0, 14400.0), (100.0,)]
    assert [g.outcomes for g in model.groups] == [
        (Outcome.COMPLETED, Outcome.HARNESS_TIMEOUT),
        (Outcome.OVERALL_TIMEOUT,),
    ]
    drawn = model.sample_group(np.random.default_rng(0), 16)
    assert len(drawn.durations_s) == 16 and set(drawn.durations_s) <= {3600.0, 14400.0, 100.0}


def test_executions_without_a_group_are_resampled_singly() -> None:
    log = TimedLog()
    execution(log, "r", "r/e0", "r/g0", 0.0, 60.0)
    execution(log, "r", "r/e1", None, 0.0, 120.0)
    model = workload_from_run(log, "r", label="mine")
    assert not model.by_query and model.name == "mine"
    assert sorted(model.groups[0].durations_s) == [60.0, 120.0]


def test_a_run_without_finished_executions_is_refused() -> None:
    log = TimedLog()
    execution(log, "r", "r/e0", "r/g0", 0.0, None)
    with pytest.raises(WorkloadError, match="no execution"):
        workload_from_run(log, "r")


def test_the_stored_workload_drives_the_simulator() -> None:
    log = TimedLog()
    for e in range(8):
        execution(log, "r", f"r/e{e}", f"r/g{e // 2}", 0.0, 1800.0 + 600.0 * e)
    result = simulate(tiny(), small_cluster(), workload_from_run(log, "r"), steps=2, seed=0).result
    assert result.workload == "run:r" and len(result.step_durations_h) == 2
