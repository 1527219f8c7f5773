"""Where a run's cell time went, from a hand-written log whose every second is known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from gyre_store import (
    EngineRegistered,
    InMemoryEventLog,
    MicroStepComputed,
    ModelCallRecorded,
    NewEvent,
    RunStarted,
    TrainingUpdate,
    WeightsPublished,
    cell_time,
    new_record,
)
from tests.examples import _arrays

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STARTED = RunStarted(
    run_id="r", harness="builtin", model="tiny", group_size=2, batch_groups=1, cells=2, cell_capacity=2
)


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at


def _log() -> InMemoryEventLog:
    clock = Clock()
    log = InMemoryEventLog(clock=clock)

    def at(seconds: float, *events: NewEvent) -> None:
        clock.at = T0 + timedelta(seconds=seconds)
        log.append(list(events))

    def computed(cell: int, micro_step: int, seconds: float) -> NewEvent:
        return NewEvent(
            MicroStepComputed(
                run_id="r", batch=0, micro_step=micro_step, phase=2, cell=cell, seconds=seconds, tokens=10
            )
        )

    def call(request: str, start: float, duration: float, engine: str = "pool-0") -> NewEvent:
        event = ModelCallRecorded(
            execution_id="e",
            run_id="r",
            request_id=request,
            engine=engine,
            started_at=(T0 + timedelta(seconds=start)).timestamp(),
            duration_s=duration,
        )
        return new_record(event, _arrays())

    at(0, NewEvent(STARTED))
    at(0, NewEvent(EngineRegistered(engine="pool-0", run_id="r", url="http://e")))
    at(1, NewEvent(EngineRegistered(engine="pool-1", run_id="r", url="http://f")))
    # generation on pool-0: [2, 6] and [4, 8] overlap (6 s together), then [20, 21]
    at(8, call("a", 2, 4), call("b", 4, 4))
    at(21, call("c", 20, 1))
    # batch 0: the core computes 3 s, the satellite 2 s; the last computation ends at 10
    at(9, computed(0, 0, 3.0))
    at(10, computed(1, 1, 2.0))
    # reduction, update and publication take 10 -> 15: the core records the update and the
    # publication together once the engines loaded the policy
    update = TrainingUpdate(
        run_id="r",
        batch=0,
        policy_version=1,
        cells=[0, 1],
        micro_steps=2,
        loss=0.1,
        grad_norm=1.0,
        final=True,
    )
    at(15, NewEvent(update), NewEvent(WeightsPublished(run_id="r", policy_version=1, step=0)))
    # a model call of another run on the same engine counts for nothing
    at(16, new_record(
        ModelCallRecorded(execution_id="o", run_id="other", request_id="z", engine="pool-0",
                          started_at=T0.timestamp(), duration_s=15.0),
        _arrays(),
    ))  # fmt: skip
    # a non-final update: its reduction is no publication (batch 1 computed 20 -> 28, update 30)
    at(
        28,
        NewEvent(
            MicroStepComputed(run_id="r", batch=1, micro_step=0, phase=2, cell=0, seconds=4.0, tokens=10)
        ),
    )
    at(30, NewEvent(msgspec.structs.replace(update, batch=1, policy_version=2, cells=[0], final=False)))
    return log


def test_trainer_time_is_split_into_compute_update_and_waiting() -> None:
    report = cell_time(_log(), "r")
    core, satellite = report.trainers
    assert core.span_s == pytest.approx(30.0)  # run.started -> last train.update
    assert core.useful_s == pytest.approx(7.0)
    assert core.parts == pytest.approx(
        {"forward-backward": 7.0, "update + publication": 7.0, "waiting": 16.0}
    )
    assert satellite.parts == pytest.approx(
        {"forward-backward": 2.0, "update + publication": 5.0, "waiting": 23.0}
    )
    assert report.trainer_fraction == pytest.approx(9.0 / 60.0)


def test_engine_time_is_the_union_of_its_open_calls() -> None:
    report = cell_time(_log(), "r")
    first, second = report.engines
    assert first.name == "engine pool-0"
    assert first.span_s == pytest.approx(30.0)  # registered -> last train.update
    assert first.useful_s == pytest.approx(7.0)  # [2, 8] and [20, 21], another run's call excluded
    assert first.parts["loading weights"] == pytest.approx(5.0)  # 10 -> 15, the final update only
    assert first.parts["idle"] == pytest.approx(18.0)
    assert second.span_s == pytest.approx(29.0) and second.useful_s == 0.0
    assert report.engine_fraction == pytest.approx(7.0 / 59.0)


def test_a_run_without_updates_has_no_figures() -> None:
    log = InMemoryEventLog()
    log.append([NewEvent(STARTED)])
    report = cell_time(log, "r")
    assert report.trainers == [] and report.engines == []
    assert report.trainer_fraction is None and report.engine_fraction is None
