"""The run follower the launcher and the evaluator workers read a run's events with."""

from __future__ import annotations

import threading

from gyre_store import EngineRegistered, ExecutionStartRequested, InMemoryEventLog
from gyre_store.log import Event, NewEvent, RunFollower, base_run, serves


def requested(execution_id: str, run_id: str) -> NewEvent:
    event = ExecutionStartRequested(execution_id=execution_id, run_id=run_id, task_id="t", engine="pool")
    return NewEvent(event, f"start:{execution_id}")


def test_side_runs_belong_to_their_run_and_look_alike_ids_do_not() -> None:
    assert serves("r", "r") and serves("r", "r~heldout")
    assert not serves("r", "rx") and not serves("r", "other") and not serves("r", "")
    assert (base_run("r~heldout"), base_run("r")) == ("r", "r")


def test_the_follower_hands_over_its_runs_events_of_its_types_once_each() -> None:
    log = InMemoryEventLog()
    seen: list[str] = []

    def note(event: Event, run_id: str) -> None:
        assert isinstance(event, ExecutionStartRequested) and run_id == event.run_id
        seen.append(event.execution_id)

    follower = RunFollower(log, "r", ["execution.start_requested"], note)
    log.append([requested("e1", "r"), requested("e2", "r~heldout"), requested("e3", "rx")])
    log.append([NewEvent(EngineRegistered(engine="pool", run_id="r", url="http://e"), "engine:pool")])
    follower.read_new()
    assert seen == ["e1", "e2"] and follower.position == log.head()
    log.append([requested("e4", "other"), requested("e5", "r")])
    follower.read_new()
    follower.read_new()
    assert seen == ["e1", "e2", "e5"]


def test_run_steps_until_stopped() -> None:
    log = InMemoryEventLog()
    stop = threading.Event()
    steps: list[int] = []

    def step() -> None:
        steps.append(len(steps))
        if len(steps) == 3:
            stop.set()

    RunFollower(log, "r", ["execution.start_requested"], lambda event, run_id: None).run(
        stop, step, poll_s=0.01
    )
    assert steps == [0, 1, 2]
