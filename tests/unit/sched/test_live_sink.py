"""The live sink turns a transition's protocol into facts for the proxy and the cells, each
append keyed by the controller's command, so a command repeated after a crash adds nothing."""

from __future__ import annotations

import pytest

from gyre_sched import KeyedSink, UnkeyedTransitionStep
from gyre_sched.decision import POOL, CoreAtBurstEnd, Placement
from gyre_sched.live.sink import LiveSink, TaskDeck
from gyre_store import (
    CellCommand,
    CellStep,
    EngineRoutingChanged,
    ExecutionRerouted,
)
from gyre_store.testing import InMemoryEventLog


def _sink() -> tuple[InMemoryEventLog, LiveSink]:
    log = InMemoryEventLog()
    return log, LiveSink(log, "run-1", TaskDeck(["t0"], seed=0), group_size=4)


def test_a_transition_step_outside_a_keyed_command_is_refused() -> None:
    log, sink = _sink()
    assert isinstance(sink, KeyedSink)
    with pytest.raises(UnkeyedTransitionStep, match="drain of cell 1"):
        sink.stop_accepting(1)
    assert log.read(0) == []


def test_the_steps_of_a_move_to_training_become_facts_in_order() -> None:
    log, sink = _sink()
    moves = (Placement(8, POOL), Placement(9, 2))
    sink.keyed(7, 0).stop_accepting(1)
    sink.keyed(7, 1).reserve_capacity(POOL, 1)  # the ledger's business: nothing appended
    sink.keyed(7, 2).update_routing(moves)
    sink.keyed(7, 3).cancel_and_retry(1, moves)
    sink.keyed(7, 4).release_rollout_memory(1)
    sink.keyed(7, 5).restore_training_state(1)
    events = [r.event for r in log.read(0)]
    assert events[0] == EngineRoutingChanged(
        engine="run-1:cell-1", accepting=False, reason="cell moves to training"
    )
    assert [(e.execution_id, e.engine) for e in events if isinstance(e, ExecutionRerouted)] == [
        ("run-1/e8", "pool"),
        ("run-1/e9", "cell-2"),
    ]
    commands = [e for e in events if isinstance(e, CellCommand)]
    assert [(c.cell_index, c.step, c.transition) for c in commands] == [
        (1, CellStep.DRAIN, 7),
        (1, CellStep.REROUTE, 7),
        (1, CellStep.RELEASE, 7),
        (1, CellStep.RESTORE, 7),
    ]


def test_a_repeated_command_appends_nothing_new() -> None:
    log, sink = _sink()
    sink.keyed(3, 0).release_training_memory(2)
    sink.keyed(3, 1).restore_rollout_engine(2)
    before = len(log.read(0))
    sink.keyed(3, 1).restore_rollout_engine(2)  # the controller crashed before recording the step
    assert len(log.read(0)) == before == 2
    sink.keyed(4, 0).restore_rollout_engine(2)  # another command: a new fact
    assert len(log.read(0)) == 3


def test_only_a_core_that_stays_gets_a_command() -> None:
    log, sink = _sink()
    stays = CoreAtBurstEnd(1.0, True, 4, 16, 24, 2, 1)
    returns = CoreAtBurstEnd(2.0, False, 40, 16, 24, 0, 1)
    sink.keyed(5, 0).core_decided(returns)
    assert log.read(0) == []
    sink.keyed(6, 0).core_decided(stays)
    [command] = [r.event for r in log.read(0)]
    assert isinstance(command, CellCommand) and (command.cell_index, command.step) == (0, CellStep.CORE_STAYS)
