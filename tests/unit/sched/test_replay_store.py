"""Replay of recorded scheduler events: identical runs match, tampered ones are caught."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from gyre_sched import (
    BatchClosed,
    BatchStarted,
    BeginTransition,
    ClockTick,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    Input,
    NoRecordedRunError,
    Outcome,
    StartExecutions,
    StoreMappingError,
    TransitionDone,
    WeightsPublished,
)
from gyre_sched.live import (
    DiffKind,
    SchedDecision,
    engine_name,
    engine_number,
    execution_id,
    fact_event,
    input_of,
    replay_run,
)
from gyre_store import Event, ExecutionStarted, InMemoryEventLog, NewEvent, RecordedEvent
from gyre_store.log import EventLog
from tests.unit.sched.helpers import tiny
from tests.unit.sched.test_controller import RUN, Driven, drive


@pytest.fixture(scope="module")
def driven() -> Driven:
    return drive(InMemoryEventLog(), tiny())


def copy_log(src: EventLog, change: Callable[[RecordedEvent], list[Event]]) -> InMemoryEventLog:
    """Every event of ``src`` appended again, each replaced by what ``change`` returns."""
    out = InMemoryEventLog()
    for recorded in src.read(limit=10**9):
        out.append(
            [NewEvent(ev, idempotency_key=None, metadata=recorded.metadata) for ev in change(recorded)]
        )
    return out


def first_transition(log: EventLog) -> RecordedEvent:
    return next(
        r
        for r in log.read(limit=10**9)
        if isinstance(r.event, SchedDecision) and isinstance(r.event.decision, BeginTransition)
    )


def test_the_recorded_run_replays_identically(driven: Driven) -> None:
    report = replay_run(driven.log, RUN)
    assert report.matched and report.ok
    assert report.inputs > 100 and report.decisions > 20


def test_a_tampered_decision_is_reported(driven: Driven) -> None:
    target = first_transition(driven.log)

    def change(recorded: RecordedEvent) -> list[Event]:
        ev = recorded.event
        if recorded.position != target.position:
            return [ev]
        assert isinstance(ev, SchedDecision) and isinstance(ev.decision, BeginTransition)
        forged = msgspec.structs.replace(ev.decision, w=ev.decision.w + 1)
        return [msgspec.structs.replace(ev, decision=forged)]

    report = replay_run(copy_log(driven.log, change), RUN)
    assert not report.matched and not report.ok
    (diff,) = report.diffs
    assert diff.kind is DiffKind.CHANGED
    assert isinstance(diff.recorded, BeginTransition) and isinstance(diff.replayed, BeginTransition)
    assert diff.recorded.w == diff.replayed.w + 1
    assert target.event == SchedDecision(run_id=RUN, seq=diff.seq, index=diff.index, decision=diff.replayed)


def test_an_appended_and_a_dropped_decision_are_reported(driven: Driven) -> None:
    target = first_transition(driven.log)

    def extra(recorded: RecordedEvent) -> list[Event]:
        ev = recorded.event
        if recorded.position != target.position:
            return [ev]
        assert isinstance(ev, SchedDecision)
        return [ev, msgspec.structs.replace(ev, index=99)]

    report = replay_run(copy_log(driven.log, extra), RUN)
    # inserted after the BeginTransition: its Reroute now sits one place later
    assert [d.kind for d in report.diffs] == [DiffKind.CHANGED, DiffKind.EXTRA]

    dropped = copy_log(driven.log, lambda r: [] if r.position == target.position else [r.event])
    kinds = {d.kind for d in replay_run(dropped, RUN).diffs}
    assert DiffKind.MISSING in kinds or DiffKind.CHANGED in kinds


def test_a_start_on_the_wrong_engine_disagrees(driven: Driven) -> None:
    log = copy_log(driven.log, lambda r: [r.event])
    placed = next(
        r.event.decision
        for r in log.read(limit=10**9)
        if isinstance(r.event, SchedDecision) and isinstance(r.event.decision, StartExecutions)
    )
    assert isinstance(placed, StartExecutions)
    p = placed.placements[0]
    wrong = ExecutionStarted(
        execution_id=execution_id(RUN, p.execution), run_id=RUN, engine=engine_name(p.engine + 1)
    )
    log.append([NewEvent(wrong)])
    report = replay_run(log, RUN)
    assert report.matched
    (item,) = report.lifecycle
    assert "placed on" in item.detail and not report.ok


def test_nothing_recorded_is_an_error() -> None:
    with pytest.raises(NoRecordedRunError):
        replay_run(InMemoryEventLog(), "absent")


@pytest.mark.parametrize(
    "event",
    [
        ExecutionFinished(1.5, 7, Outcome.HARNESS_TIMEOUT),
        GroupReady(1.5, 3),
        BatchStarted(1.5, 2),
        GroupClaimed(1.5, 3, 2),
        BatchClosed(1.5, 2),
        WeightsPublished(1.5, 4),
        TransitionDone(1.5, 1),
    ],
)
def test_facts_and_inputs_map_both_ways(event: Input) -> None:
    fact = fact_event(RUN, event, step=3)
    assert fact is not None
    log = InMemoryEventLog()
    log.append([NewEvent(fact)])
    (recorded,) = log.read()
    assert input_of(recorded, RUN, 1.5) == event
    assert input_of(recorded, "another-run", 1.5) is None


def test_ids_of_other_runs_and_engines_are_refused() -> None:
    assert fact_event(RUN, ClockTick(1.0)) is None
    log = InMemoryEventLog()
    foreign = fact_event("other", ExecutionFinished(1.0, 1))
    assert foreign is not None
    log.append([NewEvent(msgspec.structs.replace(foreign, run_id=RUN))])
    with pytest.raises(StoreMappingError):
        input_of(log.read()[0], RUN, 1.0)
    assert engine_number(engine_name(-1)) == -1 and engine_number("cell-3") == 3
    with pytest.raises(StoreMappingError):
        engine_number("gpu-3")
