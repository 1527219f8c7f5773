"""An elastic cell carries out its commands in log order, records each step as it completes,
and a cell started again resumes where its completed steps left it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from gyre_store import (
    CellCommand,
    CellStep,
    CellStepDone,
    CellTransitionDone,
    InMemoryEventLog,
    NewEvent,
)
from gyre_train.cells import ElasticCell, ElasticConfig

RUN = "run-e"


@dataclass
class FakeEngine:
    """Records what the cell asked of it; ``busy`` requests stay in flight until aborted or
    until the proxy moved them (``moved_after`` polls)."""

    busy: int = 0
    moved_after: int | None = None
    calls: list[str] = field(default_factory=list)
    polls: int = 0

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def stop_accepting(self) -> None:
        self.calls.append("stop_accepting")

    def in_flight(self) -> int:
        self.polls += 1
        if self.moved_after is not None and self.polls > self.moved_after:
            self.busy = 0
        return self.busy

    def abort_all(self) -> None:
        self.calls.append(f"abort_all {self.busy}")
        self.busy = 0


class Recording(ElasticCell):
    """An elastic cell whose training is recorded instead of run (the loops have tests of their own)."""

    trained: list[int]

    def _train(self, command: CellCommand) -> None:
        self.trained.append(command.transition)


def _cell(log: InMemoryEventLog, engine: FakeEngine, index: int = 1, grace_s: float = 5.0) -> Recording:
    zeroed: list[int] = []
    fake: Any = SimpleNamespace(
        config=SimpleNamespace(cell=index, run_id=RUN),
        replica=SimpleNamespace(zero_gradients=lambda: zeroed.append(1)),
        version=0,
    )
    now = [0.0]

    def clock() -> float:  # every reading moves time on by 0.5 s
        now[0] += 0.5
        return now[0]

    cell = Recording(
        fake, log, engine, ElasticConfig(steps=4, mu=2, reroute_grace_s=grace_s, poll_s=0.001), clock=clock
    )
    cell.trained = []
    return cell


def _command(step: CellStep, transition: int, cell: int = 1) -> NewEvent:
    return NewEvent(CellCommand(run_id=RUN, cell_index=cell, step=step, transition=transition))


def _done(log: InMemoryEventLog) -> list[tuple[CellStep, int]]:
    return [(r.event.step, r.event.transition) for r in log.read(0) if isinstance(r.event, CellStepDone)]


def _carry_out_pending(cell: Recording) -> None:
    for command in cell._pending():
        cell.carry_out(command)


def test_a_move_to_training_and_back_in_the_papers_order() -> None:
    log = InMemoryEventLog()
    engine = FakeEngine(busy=2, moved_after=3)
    cell = _cell(log, engine)
    cell.engine.start()
    cell.serving = True
    steps = (CellStep.DRAIN, CellStep.REROUTE, CellStep.RELEASE, CellStep.RESTORE)
    log.append([_command(step, 7) for step in steps])
    _carry_out_pending(cell)
    assert engine.calls == ["start", "stop_accepting", "stop"]  # the proxy moved both: nothing aborted
    assert _done(log) == [(step, 7) for step in steps]
    assert cell.training and not cell.serving and cell.trained == [7]
    order = [type(r.event).__name__ for r in log.read(0) if not isinstance(r.event, CellCommand)]
    assert order[-2:] == ["CellStepDone", "CellTransitionDone"]  # done only once restored
    log.append([_command(CellStep.RELEASE_TRAINING, 12), _command(CellStep.RESTORE_ROLLOUT, 12)])
    _carry_out_pending(cell)
    assert engine.calls[-1] == "start" and cell.serving and not cell.training
    assert _done(log)[-2:] == [(CellStep.RELEASE_TRAINING, 12), (CellStep.RESTORE_ROLLOUT, 12)]
    assert sum(isinstance(r.event, CellTransitionDone) for r in log.read(0)) == 2
    assert cell._pending() == []  # carried out once each


def test_requests_the_proxy_did_not_move_are_aborted_after_the_grace() -> None:
    log = InMemoryEventLog()
    engine = FakeEngine(busy=3)  # never moved: a held-out request, say
    cell = _cell(log, engine, grace_s=2.0)
    log.append([_command(CellStep.REROUTE, 4)])
    _carry_out_pending(cell)
    assert "abort_all 3" in engine.calls
    [done] = [r.event for r in log.read(0) if isinstance(r.event, CellStepDone)]
    assert done.detail == "3 requests aborted after 2 s"


def test_the_core_staying_trains_again_without_a_transition() -> None:
    log = InMemoryEventLog()
    cell = _cell(log, FakeEngine(), index=0)
    log.append([_command(CellStep.CORE_STAYS, 20, cell=0)])
    _carry_out_pending(cell)
    assert cell.trained == [20]
    assert not any(isinstance(r.event, CellTransitionDone) for r in log.read(0))


def test_a_cell_started_again_resumes_where_its_steps_left_it() -> None:
    log = InMemoryEventLog()
    first = _cell(log, FakeEngine())
    log.append(
        [_command(s, 3) for s in (CellStep.DRAIN, CellStep.REROUTE, CellStep.RELEASE, CellStep.RESTORE)]
    )
    first.carry_out(first._pending()[0])  # it drained, then died
    engine = FakeEngine()
    again = _cell(log, engine)
    stop = threading.Event()
    runner = threading.Thread(target=again.run, args=(stop,))
    runner.start()
    for _ in range(2000):
        if len(_done(log)) == 4:
            break
        threading.Event().wait(0.005)
    stop.set()
    runner.join(10)
    # Drained before: no engine starts for it again; the rest of the transition is carried out once.
    assert engine.calls == []
    assert _done(log) == [
        (s, 3) for s in (CellStep.DRAIN, CellStep.REROUTE, CellStep.RELEASE, CellStep.RESTORE)
    ]
    assert again.trained == [3]
    # Started again while training: it trains the open burst at once, and serves nothing.
    third_engine = FakeEngine()
    third = _cell(log, third_engine)
    stop = threading.Event()
    stop.set()
    third.run(stop)
    assert third.trained == [3] and third_engine.calls == [] and third.training


def test_a_cell_started_again_after_its_burst_ended_waits_for_its_next_command() -> None:
    from gyre_store import BatchClosed

    log = InMemoryEventLog()
    steps = (CellStep.DRAIN, CellStep.REROUTE, CellStep.RELEASE, CellStep.RESTORE)
    log.append([_command(s, 5) for s in steps])
    for s in steps:
        log.append([NewEvent(CellStepDone(run_id=RUN, cell_index=1, step=s, transition=5, seconds=0.0))])
    log.append(
        [
            NewEvent(
                CellStepDone(run_id=RUN, cell_index=1, step=CellStep.JOIN, transition=5, seconds=0.0, batch=0)
            )
        ]
    )
    log.append([NewEvent(BatchClosed(run_id=RUN, step=0))])
    stop = threading.Event()
    stop.set()
    inside = _cell(log, FakeEngine())  # batch 1 of the burst (mu = 2) is still open: it rejoins
    inside.run(stop)
    assert inside.trained == [5]
    log.append([NewEvent(BatchClosed(run_id=RUN, step=1))])
    after = _cell(log, FakeEngine())  # the burst is over: it waits for release_training
    after.run(stop)
    assert after.trained == [] and after.engine.calls == []  # type: ignore[attr-defined]
